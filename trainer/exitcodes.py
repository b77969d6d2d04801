"""Exit codes of the reference trainer: the only words it says to babysit besides its log.

babysit decides retry vs give-up from these numbers, so they never change meaning.
"""

COMPLETED = 0  # ran every step of the recipe
CRASHED = 1  # any other exception; traceback on stderr
BAD_INPUT = 2  # bad flag, bad recipe, indivisible batch: fix the command, do not retry
STOPPED = 10  # SIGTERM/SIGINT: finished the step, saved a checkpoint, resumable with --resume latest
DIVERGED = 11  # non-finite train loss; a `diverged` record was written
OUT_OF_MEMORY = 12  # allocator failure (CUDA or CPU); the original message is on stderr

NAMES = {
    COMPLETED: "completed",
    CRASHED: "crashed",
    BAD_INPUT: "bad input",
    STOPPED: "stopped on request",
    DIVERGED: "diverged",
    OUT_OF_MEMORY: "out of memory",
}
