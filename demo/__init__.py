"""The end-to-end demo behind `make demo`."""
