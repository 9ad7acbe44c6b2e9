"""The ground floor: values, words, files and statistics that every other floor uses."""
