"""`babysit demo`: everything babysit does, on real CPU training runs, on the console channel.

A fresh workspace gets two runs of the reference trainer: `drift_disc` — a pre-registered experiment
in the shape of a real one (does the eval error climb between steps 500 and 1000?) with a fixture check at
register and an amendment declared after the step-250 eval, before the data it touches — and
`retry_demo`, whose first profile diverges (a NaN injected by the trainer's test hook) so the
classifier and the retry with the next declared profile can be seen. The daemon runs accelerated
(declared minutes become seconds) until both runs are over and every message is delivered.
"""
