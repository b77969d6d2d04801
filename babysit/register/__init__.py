"""Registering a run: the one registration function, the checks `register` makes (command, log path,
hardware profile), a campaign run joining its parent, and relaunching an ended run."""
