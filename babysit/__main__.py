from babysit.cli import entry

entry()
