"""One registered run under the daemon: its supervisor (a thin shell over the pure transition in
core/run_machine.py) and the supervisor's parts, and what every run of one daemon shares (context, poll rounds)."""
