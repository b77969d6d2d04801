"""The demonstration corpus: scripted experts over named datasets, generated from a seed, cached on disk.

Nothing is downloaded. Each dataset is an embodiment/task: a P-controller expert with its own gains,
actuator response, noise and obstacles drives a point gripper towards a target in the unit square.
An episode stores the scene (gripper, velocity, target, obstacles) and the expert's actions
(dx, dy, grip); images are rendered from the scene when a batch is built (see `batches.py`), so the
cache stays small even for the 96x96 GPU recipe.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trainer.recipe import KNOWN_DATASETS, DataConfig

CACHE_VERSION = 1
ACTION_DIM = 3  # dx, dy command in [-1, 1] and a grip command in {0, 1} (plus noise)
MAX_OBSTACLES = 3
STATE_DIM = 4 + len(KNOWN_DATASETS)  # gripper xy, velocity xy, one-hot dataset (task conditioning)


@dataclass(frozen=True)
class Embodiment:
    """One dataset's expert and dynamics: why datasets differ and a policy must condition on the task."""

    kp: float  # expert proportional gain towards the target
    actuator_gain: float  # how strongly this robot responds to a command
    damping: float  # velocity carried over per step
    action_noise: float  # the expert's own noise (executed and recorded)
    obstacles: int
    avoid: float  # obstacle repulsion gain
    target_speed: float  # push: the target is shoved away when the gripper is close


EMBODIMENTS: dict[str, Embodiment] = {
    "reach_v1": Embodiment(kp=2.5, actuator_gain=1.0, damping=0.5, action_noise=0.05, obstacles=0,
                           avoid=0.0, target_speed=0.0),
    "push_v2": Embodiment(kp=3.0, actuator_gain=0.7, damping=0.6, action_noise=0.08, obstacles=1,
                          avoid=0.6, target_speed=0.02),
    "rig_demos": Embodiment(kp=2.0, actuator_gain=1.3, damping=0.3, action_noise=0.15, obstacles=3,
                            avoid=1.0, target_speed=0.0),
}


@dataclass(frozen=True)
class Corpus:
    """Episodes of all datasets; arrays indexed [episode, time, ...]."""

    gripper: np.ndarray  # [E, T, 2] float32
    velocity: np.ndarray  # [E, T, 2]
    target: np.ndarray  # [E, T, 2]
    obstacles: np.ndarray  # [E, MAX_OBSTACLES, 2]; absent obstacles sit far outside the image
    actions: np.ndarray  # [E, T, ACTION_DIM], the recorded (possibly noisy) labels
    dataset_id: np.ndarray  # [E] int64 index into KNOWN_DATASETS
    is_eval: np.ndarray  # [E] bool: held-out episodes, generated from their own seed stream


@dataclass(frozen=True)
class Stats:
    """Normalisation of state and actions, computed from the training episodes."""

    state_mean: np.ndarray
    state_std: np.ndarray
    action_mean: np.ndarray
    action_std: np.ndarray


def _episode(emb: Embodiment, rng: np.random.Generator, length: int, label_noise: float) -> dict[str, np.ndarray]:
    """Roll out the expert for one episode; the recorded label is the executed action plus label noise."""
    g = rng.uniform(0.1, 0.9, 2)
    v = np.zeros(2)
    target = rng.uniform(0.15, 0.85, 2)
    obstacles = np.full((MAX_OBSTACLES, 2), -10.0)
    obstacles[: emb.obstacles] = rng.uniform(0.2, 0.8, (emb.obstacles, 2))
    out = {k: np.zeros((length, d)) for k, d in (("g", 2), ("v", 2), ("t", 2), ("a", ACTION_DIM))}
    for step in range(length):
        out["g"][step], out["v"][step], out["t"][step] = g, v, target
        u = emb.kp * (target - g)
        for o in obstacles[: emb.obstacles]:
            away = g - o
            u += emb.avoid * away * np.exp(-(away @ away) / (2 * 0.12**2)) / 0.12
        u = np.clip(u + rng.normal(0.0, emb.action_noise, 2), -1.0, 1.0)
        grip = 1.0 if np.linalg.norm(target - g) < 0.08 else 0.0
        out["a"][step, :2] = u + rng.normal(0.0, label_noise, 2)
        out["a"][step, 2] = grip + rng.normal(0.0, label_noise)
        v = emb.damping * v + (1 - emb.damping) * emb.actuator_gain * u
        g = np.clip(g + 0.06 * v, 0.0, 1.0)
        close = target - g
        dist = np.linalg.norm(close)
        if emb.target_speed and dist < 0.15:
            target = np.clip(target + emb.target_speed * close / max(dist, 1e-3), 0.05, 0.95)
    out["o"] = obstacles
    return out


def generate(cfg: DataConfig) -> Corpus:
    """Every episode is a function of (data_seed, dataset, split, episode index) only."""
    parts: dict[str, list[np.ndarray]] = {k: [] for k in ("g", "v", "t", "o", "a", "d", "e")}
    for name in cfg.datasets:
        ds = KNOWN_DATASETS.index(name)
        for split, count in ((0, cfg.episodes_per_dataset), (1, cfg.eval_episodes_per_dataset)):
            for ep in range(count):
                rng = np.random.default_rng([cfg.data_seed, ds, split, ep])
                episode = _episode(EMBODIMENTS[name], rng, cfg.episode_len, cfg.label_noise)
                for key in ("g", "v", "t", "o", "a"):
                    parts[key].append(episode[key])
                parts["d"].append(np.int64(ds))
                parts["e"].append(np.bool_(split == 1))
    f32 = np.float32
    return Corpus(
        gripper=np.stack(parts["g"]).astype(f32), velocity=np.stack(parts["v"]).astype(f32),
        target=np.stack(parts["t"]).astype(f32), obstacles=np.stack(parts["o"]).astype(f32),
        actions=np.stack(parts["a"]).astype(f32), dataset_id=np.array(parts["d"], dtype=np.int64),
        is_eval=np.array(parts["e"], dtype=bool),
    )


def cache_key(cfg: DataConfig) -> str:
    """Only the fields that change the generated episodes name the cache file."""
    fields = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("image_augment", "train_slice")}
    blob = json.dumps({"version": CACHE_VERSION, **fields}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _atomic_write(path: Path, write: object) -> None:
    """Write to a temp file in the same directory, then os.replace: readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)  # type: ignore[operator]
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_or_generate(cfg: DataConfig, cache_dir: Path) -> Corpus:
    """Generate on first use and cache; later runs (and other ranks) read the cached file."""
    path = cache_dir / f"demos-{cache_key(cfg)}.npz"
    if path.exists():
        with np.load(path) as npz:
            return Corpus(**{f.name: npz[f.name] for f in dataclasses.fields(Corpus)})
    corpus = generate(cfg)
    _atomic_write(path, lambda fh: np.savez(fh, **dataclasses.asdict(corpus)))
    return corpus


def compute_stats(corpus: Corpus) -> Stats:
    """Mean/std over training episodes; the one-hot task part of the state is left as is."""
    train = ~corpus.is_eval
    kinematics = np.concatenate([corpus.gripper[train], corpus.velocity[train]], axis=-1).reshape(-1, 4)
    actions = corpus.actions[train].reshape(-1, ACTION_DIM)
    state_mean = np.zeros(STATE_DIM, np.float32)
    state_std = np.ones(STATE_DIM, np.float32)
    state_mean[:4] = kinematics.mean(0)
    state_std[:4] = kinematics.std(0) + 1e-6
    return Stats(state_mean, state_std, actions.mean(0).astype(np.float32),
                 (actions.std(0) + 1e-6).astype(np.float32))


def load_or_compute_stats(corpus: Corpus, cfg: DataConfig, cache_dir: Path, recompute: bool) -> Stats:
    """Cached next to the corpus; `--recompute-stats` recomputes from the data and rewrites the cache."""
    path = cache_dir / f"stats-{cache_key(cfg)}.json"
    if path.exists() and not recompute:
        raw = json.loads(path.read_text())
        return Stats(**{k: np.asarray(v, np.float32) for k, v in raw.items()})
    stats = compute_stats(corpus)
    text = json.dumps({k: v.tolist() for k, v in dataclasses.asdict(stats).items()})
    _atomic_write(path, lambda fh: fh.write(text.encode()))
    return stats
