"""Reading memory: the device's probes, the process's allocator, ``/proc`` and the children."""
