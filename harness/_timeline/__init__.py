"""The timeline: samples kept as columns, written as JSONL with a header, and read back."""
