"""The training loop: resumable at any step, checkpointing every epoch and whenever a job signal asks."""

from __future__ import annotations

import gc
import os
import socket
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from hpctrain import (
    EXIT_OK,
    EXIT_REQUEUE,
    HpctrainError,
    checkpoint,
    curves,
    dataset,
    distributed,
    metrics,
    models,
)
from hpctrain.checkpoint import Position
from hpctrain.config import RESUME_INVARIANTS, TrainConfig
from hpctrain.distributed import Runtime
from hpctrain.shards import Manifest
from hpctrain.signals import JobSignals, name_of


def _make_deterministic(device: torch.device) -> None:
    if device.type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS
        torch.backends.cudnn.benchmark = False
    # CUDA lacks deterministic kernels for a few ops (ResNet's adaptive pooling backward): warn there,
    # be strict on CPU, where a resumed run must match an uninterrupted one bit for bit.
    torch.use_deterministic_algorithms(True, warn_only=device.type == "cuda")


def _image_size(cfg: TrainConfig, manifest: Manifest) -> int | None:
    if cfg.image_size is not None:
        return cfg.image_size
    min_size = models.INPUTS[cfg.model].min_size
    height, width, _ = manifest.image_shape
    return min_size if min_size is not None and min(height, width) < min_size else None


def _check_resumable(
    state: dict[str, Any], path: Any, cfg: TrainConfig, manifest: Manifest, runtime: Runtime
) -> None:
    saved, now = state["config"], cfg.as_record()
    differences = [
        f"{key}={saved.get(key)!r} (now {now[key]!r})"
        for key in RESUME_INVARIANTS
        if saved.get(key) != now[key]
    ]
    if state.get("data_fingerprint") != manifest.fingerprint:
        differences.append("the dataset (its manifest.json differs)")
    if state["step"] > 0 and state.get("world_size") != runtime.world_size:
        differences.append(f"world_size={state.get('world_size')} mid-epoch (now {runtime.world_size})")
    if differences:
        raise HpctrainError(
            f"checkpoint {path} was written with other settings: {'; '.join(differences)}",
            hint="resume with the same settings, or start afresh with a new --output-dir",
        )


@dataclass
class Trainer:
    cfg: TrainConfig
    manifest: Manifest
    runtime: Runtime
    signals: JobSignals

    def __post_init__(self) -> None:
        cfg, runtime = self.cfg, self.runtime
        device = runtime.device
        self.amp = cfg.amp if cfg.amp is not None else device.type == "cuda"
        if self.amp and device.type != "cuda":
            raise HpctrainError("--amp needs a CUDA device", hint="drop --amp (or AMP=1) for CPU runs")
        self.amp_dtype = (
            torch.bfloat16 if device.type == "cuda" and torch.cuda.is_bf16_supported() else torch.float16
        )
        _make_deterministic(device)
        torch.manual_seed(cfg.seed)

        model_input = models.INPUTS[cfg.model]
        transform = dataset.ImageTransform(
            self.manifest, _image_size(cfg, self.manifest), model_input.channels
        )
        self.train_set = dataset.ShardDataset(self.manifest, "train", transform)
        self.val_set = dataset.ShardDataset(self.manifest, "val", transform)
        rank, world = runtime.rank, runtime.world_size
        self.train_sampler = dataset.ResumableSampler(
            len(self.train_set), cfg.batch_size, cfg.seed, rank, world, True
        )
        self.val_sampler = dataset.ResumableSampler(
            len(self.val_set), cfg.batch_size, cfg.seed, rank, world, False
        )
        pin = device.type == "cuda"
        self.train_loader = dataset.make_loader(self.train_set, self.train_sampler, cfg.workers, pin)
        self.val_loader = dataset.make_loader(self.val_set, self.val_sampler, cfg.workers, pin)
        self.steps_per_epoch = self.train_sampler.steps
        if cfg.steps_per_epoch:
            self.steps_per_epoch = min(self.steps_per_epoch, cfg.steps_per_epoch)

        in_channels = model_input.channels or self.manifest.image_shape[2]
        self.model = models.build(
            cfg.model, in_channels, len(self.manifest.classes), cfg.pretrained_weights
        ).to(device)
        self.optimizer = torch.optim.SGD(
            self.model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay
        )
        self.scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(self.optimizer, T_max=cfg.epochs)
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.amp and self.amp_dtype == torch.float16)
        self.log = metrics.MetricsLog(cfg.metrics_path, enabled=runtime.is_main)
        self.curves = curves.Curves(cfg.output_dir / "tensorboard", enabled=runtime.is_main)
        self.global_step = 0  # training steps done since the run began: the curves' axis
        self.net: torch.nn.Module = self.model
        self.frozen: bool | None = None

    # -- checkpoints -------------------------------------------------------------------------------

    def _state(self, position: Position, totals: dict | None, last_metrics: dict | None) -> dict[str, Any]:
        device = self.runtime.device
        return {
            "epoch": position.epoch,
            "step": position.step,
            "global_step": self.global_step,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "rng": {
                "torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
            },
            "config": self.cfg.as_record(),
            "world_size": self.runtime.world_size,
            "data_fingerprint": self.manifest.fingerprint,
            "epoch_totals": totals,
            "last_metrics": last_metrics,
            "torch_version": str(torch.__version__),
        }

    def save(self, position: Position, totals: dict | None, last_metrics: dict | None) -> str:
        """Rank 0 writes; every rank waits for it, so none exits while the file is half written."""
        name = position.filename
        if self.runtime.is_main:
            checkpoint.save(
                self.cfg.checkpoint_dir,
                position,
                self._state(position, totals, last_metrics),
                self.cfg.keep_checkpoints,
            )
        distributed.barrier(self.runtime)
        return name

    def restore(self) -> tuple[Position, dict | None, dict | None, dict | None]:
        state, path, skipped = checkpoint.load_newest(self.cfg.checkpoint_dir)
        if self.runtime.is_main:
            for bad, reason in skipped:
                metrics.warn(f"ignoring unreadable checkpoint {bad.name}: {reason}")
        if state is None:
            return Position(0, 0), None, None, None
        _check_resumable(state, path, self.cfg, self.manifest, self.runtime)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        torch.set_rng_state(state["rng"]["torch"])
        if self.runtime.device.type == "cuda" and state["rng"]["cuda"] is not None:
            torch.cuda.set_rng_state(state["rng"]["cuda"], self.runtime.device)
        position = Position(state["epoch"], state["step"])
        # A checkpoint from before the curves counts its steps at this run's size.
        self.global_step = state.get("global_step", position.epoch * self.steps_per_epoch + position.step)
        resumed = {"checkpoint": path.name, "epoch": position.epoch, "step": position.step}
        # Rank 0 carries the epoch's totals so far (summed over ranks when saved); the others restart at 0.
        totals = state["epoch_totals"] if self.runtime.is_main else None
        return position, totals, state["last_metrics"], resumed | {"skipped": [p.name for p, _ in skipped]}

    # -- the loop ----------------------------------------------------------------------------------

    def _set_phase(self, epoch: int) -> str:
        frozen = epoch < self.cfg.freeze_epochs
        if frozen != self.frozen:
            self.trainable = models.set_backbone_frozen(self.model, frozen)
            # DDP decides which parameters to all-reduce when it is built: rebuild it per phase.
            if self.runtime.distributed:
                device_ids = [self.runtime.device.index] if self.runtime.device.type == "cuda" else None
                self.net = DistributedDataParallel(self.model, device_ids=device_ids)
            self.frozen = frozen
        return "frozen-backbone" if frozen else "all-layers"

    def _forward(self, net: torch.nn.Module, images: torch.Tensor, targets: torch.Tensor):
        device = self.runtime.device
        images = images.to(device, non_blocking=True)
        targets = targets.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=self.amp_dtype, enabled=self.amp):
            logits = net(images)
            loss = F.cross_entropy(logits, targets)
        return logits, loss, targets

    def evaluate(self) -> tuple[float, float]:
        self.model.eval()
        totals = metrics.EpochTotals(self.runtime.device)
        with torch.no_grad():
            for images, targets in self.val_loader:
                logits, loss, targets = self._forward(self.model, images, targets)
                totals.add(loss, logits, targets)
        loss, accuracy, _ = metrics.summarise(distributed.sum_across_ranks(self.runtime, totals.packed()))
        return loss, accuracy

    def run(self) -> int:
        cfg, runtime = self.cfg, self.runtime
        position, saved_totals, last_metrics, resumed = self.restore()
        self.log.write(
            "start",
            host=socket.gethostname(),
            slurm_job_id=os.environ.get("SLURM_JOB_ID"),
            device=str(runtime.device),
            amp=self.amp,
            world_size=runtime.world_size,
            workers=cfg.workers,
            train_samples=len(self.train_set),
            val_samples=len(self.val_set),
            steps_per_epoch=self.steps_per_epoch,
            parameters=sum(p.numel() for p in self.model.parameters()),
            resumed=resumed,
            torch=str(torch.__version__),
            config=cfg.as_record(),
        )
        if resumed is not None:
            self.curves.resume(self.global_step)
        for epoch in range(position.epoch, cfg.epochs):
            start_step = position.step if epoch == position.epoch else 0
            totals = metrics.EpochTotals(runtime.device, saved_totals if start_step > 0 else None)
            stopped = self._train_epoch(epoch, start_step, totals)
            if stopped is not None:
                return stopped
            last_metrics = self._finish_epoch(epoch, start_step, totals)
        digests = distributed.gather(runtime, metrics.weights_digest(self.model))
        distributed.barrier(runtime)  # every rank has its gather result before any rank tears down
        self.log.write(
            "done",
            epochs=cfg.epochs,
            **(last_metrics or {}),
            weights_sha256=digests[0],
            rank_weights_sha256=digests,
        )
        self.curves.close()
        return EXIT_OK

    def _train_epoch(self, epoch: int, start_step: int, totals: metrics.EpochTotals) -> int | None:
        """Train from `start_step` to the end of the epoch; EXIT_REQUEUE if a stop signal came first."""
        runtime = self.runtime
        self.phase = self._set_phase(epoch)
        self.train_sampler.set_epoch(epoch, start_step)
        self.model.train()
        self.count_at_start = int(distributed.sum_across_ranks(runtime, totals.packed())[2].item())
        self.epoch_started = time.perf_counter()
        self.data_wait = 0.0
        batches = iter(self.train_loader)
        for step in range(start_step, self.steps_per_epoch):
            # The stop signal any rank caught (0: none), so rank 0 names it wherever it came first.
            stop, save_now = distributed.largest_across_ranks(
                runtime, [self.signals.stop_signal or 0, int(self.signals.checkpoint_requested)]
            )
            if stop or save_now:
                summed = distributed.sum_across_ranks(runtime, totals.packed())
                name = self.save(Position(epoch, step), metrics.totals_record(summed), None)
                self.signals.checkpoint_requested = False
                if stop:
                    self.log.write(
                        "preempted",
                        signal=name_of(stop),
                        epoch=epoch + 1,
                        step=step,
                        checkpoint=name,
                    )
                    return EXIT_REQUEUE
                self.log.write("checkpoint", epoch=epoch + 1, step=step, checkpoint=name)
            waited_from = time.perf_counter()
            images, targets = next(batches)
            self.data_wait += time.perf_counter() - waited_from
            logits, loss, targets = self._forward(self.net, images, targets)
            self.optimizer.zero_grad(set_to_none=True)
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            totals.add(loss, logits, targets)
            self.global_step += 1
            if self.cfg.log_interval and (step + 1) % self.cfg.log_interval == 0:
                step_loss = loss.item()
                self.log.write("step", epoch=epoch + 1, step=step + 1, loss=round(step_loss, 6))
                self.curves.scalars(self.global_step, {"train/step_loss": step_loss})
            if self.cfg.step_pause:
                self.signals.rest(self.cfg.step_pause)
        return None

    def _finish_epoch(self, epoch: int, start_step: int, totals: metrics.EpochTotals) -> dict[str, Any]:
        runtime = self.runtime
        train_time = time.perf_counter() - self.epoch_started
        train_loss, train_accuracy, samples = metrics.summarise(
            distributed.sum_across_ranks(runtime, totals.packed())
        )
        distributed.average_buffers(runtime, self.model)
        val_loss, val_accuracy = self.evaluate()
        lr = self.optimizer.param_groups[0]["lr"]
        self.scheduler.step()
        result = {
            "train_loss": train_loss,
            "train_accuracy": train_accuracy,
            "val_loss": val_loss,
            "val_accuracy": val_accuracy,
        }
        name = self.save(Position(epoch + 1, 0), None, result)
        samples_per_s = (samples - self.count_at_start) / train_time
        self.log.write(
            "epoch",
            epoch=epoch + 1,
            epochs=self.cfg.epochs,
            phase=self.phase,
            trainable_parameters=self.trainable,
            lr=lr,
            **result,
            resumed_at_step=start_step or None,
            epoch_time_s=round(time.perf_counter() - self.epoch_started, 4),
            train_time_s=round(train_time, 4),
            samples_per_s=round(samples_per_s, 2),
            data_wait_s=round(self.data_wait, 4),
            data_wait_fraction=round(self.data_wait / train_time, 4),
            checkpoint=name,
        )
        self.curves.scalars(
            self.global_step,
            {"train/loss": train_loss, "train/accuracy": train_accuracy, "val/loss": val_loss,
             "val/accuracy": val_accuracy, "train/lr": lr,
             "train/samples_per_s": samples_per_s},
        )  # fmt: skip
        return result


def run(cfg: TrainConfig, manifest: Manifest, signals: JobSignals) -> int:
    runtime = distributed.setup(cfg.device)
    sampler = None
    trainer = None
    try:
        trainer = Trainer(cfg, manifest, runtime, signals)
        if runtime.device.type == "cuda" and runtime.local_rank == 0:
            sampler = metrics.GpuSampler(cfg.output_dir, cfg.gpu_sample_interval)
        return trainer.run()
    finally:
        if sampler is not None:
            sampler.stop()
        # DDP's reducer must be gone before its process group: destroyed the other way round,
        # a gloo rank could hang at exit.
        trainer = None
        gc.collect()
        distributed.teardown(runtime)
