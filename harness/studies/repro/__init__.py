"""``harness repro``: the registry of reproductions and their planned runs (:mod:`.plan`), running them one after
another or ``--jobs N`` at a time (:mod:`.jobs`), and their table, figure and results (:mod:`.report`)."""
