"""Loading the shard format into PyTorch: the Dataset, its transform, the resumable sampler, the loaders."""

from __future__ import annotations

import bisect
import math
import signal
from collections.abc import Iterator

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, Sampler

from hpctrain import HpctrainError
from hpctrain.shards import Manifest


class ImageTransform:
    """uint8 HxWxC -> normalised float CxSxS, with grey repeated to the channels the model wants."""

    def __init__(self, manifest: Manifest, size: int | None, channels: int | None) -> None:
        height, width, data_channels = manifest.image_shape
        self.size = None if size is None or (size, size) == (height, width) else size
        self.repeat = 1
        if channels is not None and channels != data_channels:
            if data_channels != 1:
                raise HpctrainError(
                    f"the model needs {channels}-channel images; the data has {data_channels}"
                )
            self.repeat = channels
        self.mean = torch.tensor(manifest.mean, dtype=torch.float32).view(-1, 1, 1)
        self.std = torch.tensor(manifest.std, dtype=torch.float32).view(-1, 1, 1)

    def __call__(self, image: np.ndarray) -> torch.Tensor:
        x = torch.from_numpy(np.array(image)).permute(2, 0, 1).float().div_(255)
        x = (x - self.mean) / self.std
        if self.size is not None:
            x = F.interpolate(
                x.unsqueeze(0), size=(self.size, self.size), mode="bilinear", align_corners=False
            )[0]
        if self.repeat > 1:
            x = x.repeat(self.repeat, 1, 1)
        return x


class ShardDataset(Dataset):
    """One split of a shard directory. Images stay memory-mapped; labels (small) are read into memory."""

    def __init__(self, manifest: Manifest, split: str, transform: ImageTransform) -> None:
        self.transform = transform
        self.images: list[np.ndarray] = []
        labels: list[np.ndarray] = []
        for shard in manifest.splits[split]:
            try:
                images = np.load(shard.images, mmap_mode="r", allow_pickle=False)
                shard_labels = np.load(shard.labels, allow_pickle=False)
            except (OSError, ValueError) as exc:
                raise HpctrainError(f"cannot read shard {shard.images.name}: {exc}") from None
            if images.shape != (shard.count, *manifest.image_shape) or images.dtype != np.uint8:
                raise HpctrainError(
                    f"shard {shard.images.name} holds {images.dtype} {images.shape}; "
                    f"the manifest promises uint8 {(shard.count, *manifest.image_shape)}"
                )
            if shard_labels.shape != (shard.count,) or not np.issubdtype(shard_labels.dtype, np.integer):
                raise HpctrainError(f"shard {shard.labels.name} must hold {shard.count} integer labels")
            if shard.count and (shard_labels.min() < 0 or shard_labels.max() >= len(manifest.classes)):
                raise HpctrainError(
                    f"shard {shard.labels.name} has labels outside 0..{len(manifest.classes) - 1}"
                )
            self.images.append(images)
            labels.append(shard_labels.astype(np.int64))
        self.labels = np.concatenate(labels)
        self.offsets = np.cumsum([0] + [len(a) for a in self.images]).tolist()

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        shard = bisect.bisect_right(self.offsets, index) - 1
        image = self.images[shard][index - self.offsets[shard]]
        return self.transform(image), int(self.labels[index])


def epoch_seed(seed: int, epoch: int) -> int:
    """Seed of everything random in one epoch: a function of (seed, epoch) only, so a resumed run
    replays the interrupted epoch exactly."""
    return seed * 1_000_003 + epoch


class ResumableSampler(Sampler[int]):
    """This rank's share of a per-epoch permutation, optionally starting `start_step` batches in.

    Like DistributedSampler (pad to a multiple of the world size, take every world_size-th index),
    but the shuffle depends only on (seed, epoch), and it can skip the batches a checkpoint has
    already trained on.
    """

    def __init__(
        self, size: int, batch_size: int, seed: int, rank: int, world_size: int, shuffle: bool
    ) -> None:
        self.size, self.batch_size, self.seed = size, batch_size, seed
        self.rank, self.world_size, self.shuffle = rank, world_size, shuffle
        self.epoch = 0
        self.start_step = 0
        self.per_rank = math.ceil(size / world_size) if shuffle else len(range(rank, size, world_size))

    def set_epoch(self, epoch: int, start_step: int = 0) -> None:
        self.epoch, self.start_step = epoch, start_step

    @property
    def steps(self) -> int:
        """Batches in a whole epoch for this rank."""
        return math.ceil(self.per_rank / self.batch_size)

    def _indices(self) -> list[int]:
        if not self.shuffle:  # evaluation: every sample exactly once across the ranks
            return list(range(self.rank, self.size, self.world_size))
        generator = torch.Generator().manual_seed(epoch_seed(self.seed, self.epoch))
        order = torch.randperm(self.size, generator=generator).tolist()
        padded = self.per_rank * self.world_size
        order += order[: padded - len(order)]
        return order[self.rank : padded : self.world_size]

    def __iter__(self) -> Iterator[int]:
        return iter(self._indices()[self.start_step * self.batch_size :])

    def __len__(self) -> int:
        return max(self.per_rank - self.start_step * self.batch_size, 0)


def _ignore_job_signals(_worker_id: int) -> None:
    # Slurm signals every process of a step; workers must leave the checkpoint to the main process.
    for signum in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)


def make_loader(
    dataset: ShardDataset, sampler: ResumableSampler, workers: int, pin_memory: bool
) -> DataLoader:
    return DataLoader(
        dataset,
        batch_size=sampler.batch_size,
        sampler=sampler,
        num_workers=workers,
        pin_memory=pin_memory,
        persistent_workers=workers > 0,
        worker_init_fn=_ignore_job_signals if workers > 0 else None,
        # Its own generator, so creating an iterator never draws from the global RNG: the global
        # stream then depends only on the training steps taken, which a checkpoint restores.
        generator=torch.Generator().manual_seed(sampler.seed),
    )
