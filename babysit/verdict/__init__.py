"""The verdict's shell: the frozen prereg record, the verdict read from the log and the store, its chart."""
