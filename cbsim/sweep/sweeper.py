"""hydra/sweeper=cbsim: Hydra's basic sweeper, without composing every job a second time.

The basic sweeper composes each job's config before launching it, to catch a composition error
early; cbsim.preflight has composed and checked every job already (before any directory was
made), so those jobs are not composed again. A job the preflight did not compose (another
sweeper's, say) is checked the basic sweeper's way.
"""

from __future__ import annotations

from collections.abc import Sequence

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

from cbsim.sweep.compose import composed_jobs


class PrecomposedSweeper(BasicSweeper):
    def validate_batch_is_legal(self, batch: Sequence[Sequence[str]]) -> None:
        unchecked = [job for job in batch if tuple(job) not in composed_jobs]
        if unchecked:
            super().validate_batch_is_legal(unchecked)
