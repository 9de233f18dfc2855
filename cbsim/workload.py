"""Requests from the workload config: lengths, arrival times and prompt token ids.

Everything is drawn from ``workload.seed`` through independent numpy streams (one each for prompt
lengths, generation lengths, arrivals and token ids), so changing one knob never reshuffles the
others and the same config always yields the same requests.

Length distributions (``prompt_*`` and ``gen_*`` alike; ``value`` is ``prompt_len`` / ``gen_len``,
``spread`` is ``prompt_spread`` / ``gen_spread``):

- ``fixed``: every request gets ``value``.
- ``uniform``: integers uniform on ``[round(value * (1 - spread)), round(value * (1 + spread))]``.
- ``lognormal``: ``exp(N(mu, spread))`` rounded, with ``mu = log(value) - spread**2 / 2`` so that
  ``value`` is the *mean*, as the config documents (the median is ``value * exp(-spread**2 / 2)``).
- ``file``: one integer per line, or a JSON list of integers; cycled when it holds fewer lengths
  than there are requests. ``check_lengths_files`` refuses a file that is missing or holds anything
  but integers in range.

Every length is clipped to at least 1. Arrivals are all at 0 (``offline``) or a Poisson process at
``workload.rate`` requests/s (``poisson``: exponential gaps, the first request at t = 0).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from cbsim.config.errors import ConfigError
from cbsim.config.schema import WorkloadConfig

MAX_LENGTH = 1 << 24  # the range workload.prompt_len and workload.gen_len allow


class Request:
    """One generation request: a prompt and how many tokens to generate at most.

    ``prompt_ids`` is an array of token ids, or the ``PromptIds`` of the workload that drew the
    request (``make_requests``): then the ids are drawn the first time anyone reads them. The
    runtime reads them; the simulator reads ``prompt_len`` only, so a simulation of a million
    requests holds a few numbers a request and no token id."""

    __slots__ = ("rid", "arrival_s", "max_new_tokens", "_ids")

    def __init__(
        self, rid: int, arrival_s: float, prompt_ids: np.ndarray | PromptIds, max_new_tokens: int
    ) -> None:
        self.rid = rid
        self.arrival_s = arrival_s
        self.max_new_tokens = max_new_tokens
        self._ids = prompt_ids

    @property
    def prompt_ids(self) -> np.ndarray:
        """The prompt's token ids (int32 when drawn)."""
        ids = self._ids
        return ids[self.rid] if isinstance(ids, PromptIds) else ids

    @prompt_ids.setter
    def prompt_ids(self, ids: np.ndarray) -> None:
        self._ids = ids

    @property
    def prompt_len(self) -> int:
        ids = self._ids
        return ids.length(self.rid) if isinstance(ids, PromptIds) else int(len(ids))

    def with_max_new_tokens(self, max_new_tokens: int) -> Request:
        """The same request (same prompt, drawn or given) allowed ``max_new_tokens``."""
        return Request(self.rid, self.arrival_s, self._ids, max_new_tokens)

    def __repr__(self) -> str:
        return (
            f"Request(rid={self.rid}, arrival_s={self.arrival_s}, prompt_len={self.prompt_len}, "
            f"max_new_tokens={self.max_new_tokens})"
        )


class PromptIds:
    """The prompt token ids of every request ``make_requests`` drew, indexed by rid: one draw
    of the workload's token-id stream (the same ids whoever reads first), made on first read."""

    def __init__(self, seed: np.random.SeedSequence, vocab_size: int, lengths: np.ndarray) -> None:
        self.seed = seed
        self.vocab_size = vocab_size
        self.lengths = lengths
        self._ids: np.ndarray | None = None
        self._offsets: np.ndarray | None = None

    @property
    def drawn(self) -> bool:
        """Whether anyone has read an id (a simulation never does)."""
        return self._ids is not None

    def length(self, rid: int) -> int:
        return int(self.lengths[rid])

    def __getitem__(self, rid: int) -> np.ndarray:
        if self._ids is None or self._offsets is None:
            vocab = self.vocab_size
            dtype = np.int32 if vocab <= np.iinfo(np.int32).max else np.int64
            rng = np.random.default_rng(self.seed)
            self._ids = rng.integers(0, vocab, size=int(self.lengths.sum()), dtype=dtype)
            self._offsets = np.concatenate(([0], np.cumsum(self.lengths)))
        return self._ids[self._offsets[rid] : self._offsets[rid + 1]]


def make_requests(workload: WorkloadConfig, vocab_size: int) -> list[Request]:
    """``workload.total_requests`` requests, sorted by arrival, rids 0..n-1, deterministic.
    Their prompt ids are drawn when first read (``PromptIds``)."""
    if vocab_size < 1:
        raise ValueError(f"vocab_size={vocab_size} must be >= 1")
    prompt, gen, arrivals = draw_shapes(workload)
    ids = PromptIds(np.random.SeedSequence(workload.seed).spawn(4)[3], vocab_size, prompt)
    return [Request(i, a, ids, g) for i, (a, g) in enumerate(zip(arrivals.tolist(), gen.tolist()))]


def draw_shapes(workload: WorkloadConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every request's prompt length, new tokens and arrival (s), as ``make_requests`` draws
    them, without the token ids (cheap: what a run's size is estimated from)."""
    check_lengths_files(workload)
    n = workload.total_requests
    s_prompt, s_gen, s_arrival, _ = np.random.SeedSequence(workload.seed).spawn(4)
    w = workload
    prompt = _lengths(
        "prompt",
        w.prompt_dist,
        w.prompt_len,
        w.prompt_spread,
        w.prompt_file,
        n,
        np.random.default_rng(s_prompt),
    )
    gen = _lengths(
        "gen", w.gen_dist, w.gen_len, w.gen_spread, w.gen_file, n, np.random.default_rng(s_gen)
    )
    return prompt, gen, _arrivals(w.arrival, w.rate, n, np.random.default_rng(s_arrival))


def check_requests_fit(
    requests: Iterable[Request],
    max_context: int,
    kv_capacity_tokens: int,
    max_prompt_tokens: int | None = None,
) -> None:
    """Raise a ValueError naming the first request that could never run: prompt +
    max_new_tokens over the model's context (``model.max_position_embeddings``, counted the
    usual way), or more KV entries than the whole cache holds (prompt + max_new_tokens - 1: the
    last output is never fed back, exactly what the scheduler allocates), or (when
    ``max_prompt_tokens`` is given: ``workload.max_batch_tokens`` with chunked prefill off) a
    prompt that never fits one step. Both back ends call this before anything starts."""
    for r in requests:
        if max_prompt_tokens is not None and r.prompt_len > max_prompt_tokens:
            raise ValueError(
                f"request {r.rid}: prompt {r.prompt_len} tokens exceeds workload.max_batch_tokens="
                f"{max_prompt_tokens} with workload.chunked_prefill=false; allowed: a larger "
                "max_batch_tokens, chunked_prefill=true or shorter prompts"
            )
        total = r.prompt_len + r.max_new_tokens
        if total > max_context:
            raise ValueError(
                f"request {r.rid}: prompt {r.prompt_len} + max_new_tokens {r.max_new_tokens} = "
                f"{total} tokens exceeds the model context of {max_context} tokens "
                "(model.max_position_embeddings)"
            )
        if total - 1 > kv_capacity_tokens:
            raise ValueError(
                f"request {r.rid}: prompt {r.prompt_len} + max_new_tokens {r.max_new_tokens} "
                f"needs {total - 1} KV entries, over the KV cache capacity of "
                f"{kv_capacity_tokens} tokens (workload.kv_num_blocks x workload.kv_block_size); "
                "allowed: shorter requests or more KV blocks"
            )


def _lengths(
    which: str,
    dist: str,
    value: int,
    spread: float,
    path: str | None,
    n: int,
    rng: np.random.Generator,
) -> np.ndarray:
    if dist == "fixed":
        out = np.full(n, value, dtype=np.int64)
    elif dist == "uniform":
        low = int(round(value * (1.0 - spread)))
        high = int(round(value * (1.0 + spread)))
        out = rng.integers(low, high + 1, size=n, dtype=np.int64)
    elif dist == "lognormal":
        mu = np.log(value) - spread * spread / 2.0
        out = np.rint(rng.lognormal(mu, spread, size=n)).astype(np.int64)
    elif dist == "file":
        table = read_lengths(path, f"workload.{which}_file")
        out = np.resize(table, n)  # cycles
    else:
        raise ValueError(
            f"workload.{which}_dist={dist!r}; allowed: fixed, uniform, lognormal, file"
        )
    return np.maximum(out, 1)


def check_lengths_files(workload: WorkloadConfig) -> None:
    """Every lengths file the workload names is read and checked (exists, integers from 1 to
    MAX_LENGTH): a ConfigError naming the key, the file and what is allowed. Called at config
    load time and by ``make_requests``. (A file named without ``*_dist=file`` the schema already
    refuses.)"""
    for which in ("prompt", "gen"):
        path = getattr(workload, f"{which}_file")
        if path or getattr(workload, f"{which}_dist") == "file":
            read_lengths(path, f"workload.{which}_file")


def read_lengths(path: str | None, key: str = "lengths file") -> np.ndarray:
    """Positive integer lengths from a file: one per line (blank lines and # comments skipped)
    or a JSON list. Errors (ConfigError) name the key, the path and the offending entry."""
    if not path:
        raise ConfigError(f"{key}: no path given")
    p = Path(path).expanduser()
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"{key}={path}: cannot read the lengths file ({exc}); allowed: a readable file of "
            "lengths, one integer a line or a JSON list"
        ) from None
    stripped = text.strip()
    values: list[object]
    if stripped.startswith("["):
        try:
            values = json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"{key}={path}: not a JSON list of lengths ({exc}); allowed: [12, 40, ...]"
            ) from None
        if not isinstance(values, list):
            raise ConfigError(f"{key}={path}: not a JSON list of lengths; allowed: [12, 40, ...]")
    else:
        values = [
            line.split("#", 1)[0].strip()
            for line in text.splitlines()
            if line.split("#", 1)[0].strip()
        ]
    out = []
    for i, v in enumerate(values):
        try:
            if isinstance(v, bool) or (isinstance(v, float) and not v.is_integer()):
                raise ValueError
            length = int(v)  # type: ignore[call-overload]
        except (TypeError, ValueError):
            raise ConfigError(
                f"{key}={path}: entry {i + 1} ({v!r}) is not an integer; allowed: integers "
                f"from 1 to {MAX_LENGTH}"
            ) from None
        if not 1 <= length <= MAX_LENGTH:
            raise ConfigError(
                f"{key}={path}: entry {i + 1} is {length}; allowed: lengths from 1 to {MAX_LENGTH}"
            )
        out.append(length)
    if not out:
        raise ConfigError(f"{key}={path}: the file holds no lengths; allowed: one or more lengths")
    return np.asarray(out, dtype=np.int64)


def _arrivals(kind: str, rate: float, n: int, rng: np.random.Generator) -> np.ndarray:
    if kind == "offline":
        return np.zeros(n)
    if kind == "poisson":
        gaps = rng.exponential(1.0 / rate, size=n)
        gaps[0] = 0.0  # the first request opens the run
        return np.cumsum(gaps)
    raise ValueError(f"workload.arrival={kind!r}; allowed: offline, poisson")
