"""The sweep's progress bar (tqdm, on stderr), owned by the process that launched the sweep.

Module state, not the callback's: Hydra pickles its callbacks into every job process, and a
bar belongs to one terminal. Job processes never open one, so their updates do nothing.
"""

from __future__ import annotations

from tqdm import tqdm

_bar: tqdm | None = None


def open_bar(total: int | None, initial: int = 0) -> None:
    global _bar
    close_bar()
    _bar = tqdm(total=total, initial=initial, unit="job", desc="sweep", dynamic_ncols=True)


def update_bar(done: int) -> None:
    if _bar is not None:
        _bar.update(done)


def close_bar() -> None:
    global _bar
    if _bar is not None:
        _bar.close()
        _bar = None
