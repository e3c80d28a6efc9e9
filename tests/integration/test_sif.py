"""The sif stage against a real dockerd and a real Apptainer (1.4, in hpcbox's helper container)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from hpcbox.build.image import LABEL_CONTENT, LABEL_LOCK, LABEL_SOURCE_DATE_EPOCH
from hpcbox.errors import HpcboxError
from hpcbox.files import SHA256_MEMO, file_sha256
from hpcbox.render.profiles import load_profile
from hpcbox.sif.compression import parse_compression
from hpcbox.sif.convert import (
    BUILD_DATE_LABEL,
    LABEL_CONVERTER,
    LABEL_IMAGE_ID,
    LABEL_IMAGE_REF,
    LABEL_OFF_LOCK,
    build_sif,
    cached,
    rootfs_sha256,
    sif_path_for,
)
from hpcbox.tools import docker
from hpcbox.tools.apptainer import ZLIB_LIBDEFLATE, Apptainer
from tests.fixtures.sif import WITH_CODE

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def _quiet(line: str) -> None:
    pass


def _convert(image, cache: Path, **options):
    return build_sif(image, cache=cache, say=_quiet, on_line=_quiet, **options)


@pytest.fixture(scope="session")
def small_sifs(small_image, sif_cache):
    """The small image's SIF by both paths, each in its own cache directory."""
    return {path: _convert(small_image, sif_cache / path, conversion=path) for path in ("fast", "reference")}


# --- the trainer image, as on a cluster node ---------------------------------------------------------


def test_trainer_help_runs_as_non_root_user(trainer_sif, cluster_node):
    done = cluster_node.run(
        f"id -u && apptainer exec {WITH_CODE} --bind /disk/scratch:/scratch "
        f"{cluster_node.sif(trainer_sif.path)} python -m hpctrain --help"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "1500"
    assert "make-data" in done.stdout and "train" in done.stdout


def test_trainer_one_epoch_writes_metrics_into_bound_scratch(trainer_sif, cluster_node):
    run = "sif-epoch"
    done = cluster_node.run(
        f"mkdir -p /disk/scratch/{run} && apptainer exec {WITH_CODE} --bind /disk/scratch/{run}:/scratch "
        f"{cluster_node.sif(trainer_sif.path)} sh -c "
        "'python -m hpctrain make-data --out /scratch/digits.tar && mkdir -p /scratch/data && "
        "tar -xf /scratch/digits.tar -C /scratch/data && python -m hpctrain train --data-dir /scratch/data "
        "--output-dir /scratch/out --epochs 1 --device cpu --workers 0'",
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    metrics = cluster_node.scratch / run / "out" / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    assert rows, "metrics.jsonl is empty"
    assert (cluster_node.scratch / run / "out" / "checkpoints").is_dir()


def test_nv_exits_zero_without_gpu(trainer_sif, cluster_node):
    done = cluster_node.run(f"apptainer exec --nv {cluster_node.sif(trainer_sif.path)} true")
    assert done.returncode == 0, done.stderr


def test_inspect_shows_provenance(environment_image, trainer_sif, apptainer_helper):
    attributes = Apptainer("container", apptainer_helper).inspect(trainer_sif.path)
    labels = attributes["labels"]
    # Built on the pinned base, the image is reproducible: its SIF names the content, not what this
    # engine calls it (its id differs from build to build for the same content; its tag is local).
    assert LABEL_IMAGE_ID not in labels and LABEL_IMAGE_REF not in labels
    # The converter as the helper image has it today (Debian's sid moves Apptainer on): asked of it.
    installed = docker.run_once(apptainer_helper, ["apptainer", "--version"], what="ask the helper").strip()
    assert re.match(rf"{re.escape(installed)}; mksquashfs version \d\S* \(\S+\)", labels[LABEL_CONVERTER])
    assert trainer_sif.image_id == environment_image.id
    for key in ("org.opencontainers.image.revision", LABEL_LOCK, LABEL_CONTENT, LABEL_SOURCE_DATE_EPOCH):
        assert labels[key] == environment_image.labels[key]
    assert "Bootstrap: docker-archive" in attributes["deffile"]


def test_a_gzip_sif_names_the_libdeflate_that_compressed_it(small_sifs, apptainer_helper):
    helper = Apptainer("container", apptainer_helper)
    fast, reference = (
        helper.inspect(small_sifs[path].path)["labels"][LABEL_CONVERTER] for path in small_sifs
    )
    assert re.fullmatch(
        r"apptainer version \S+; mksquashfs version \S+ \(\S+\); gzip by libdeflate 1\.\S+", fast
    )
    assert "libdeflate" not in reference  # `apptainer build` runs mksquashfs as it is


def test_second_conversion_is_a_cache_hit(environment_image, trainer_sif, sif_cache):
    compression = load_profile("local").apptainer.compression
    again = _convert(environment_image, sif_cache, compression=compression)
    assert again.built is False
    assert again.path == trainer_sif.path == sif_path_for(environment_image.id, compression, sif_cache)
    assert again.sha256 == trainer_sif.sha256


# --- the two conversion paths, on the small image -----------------------------------------------------


def _inside(node, sif_path: Path) -> dict:
    sif = node.sif(sif_path)
    inspect = node.run(f"apptainer inspect --all --json {sif}")
    env = node.run(f"apptainer exec {sif} env")
    run = node.run(f"apptainer run {sif} one 'two three'")
    default_run = node.run(f"apptainer run {sif}")
    files = node.run(
        f'apptainer exec {sif} sh -c \'cd /.singularity.d && find . | sort | xargs -d "\\n" '
        'sha256sum 2>/dev/null; cd / && stat -c "%n %A %U %G %F" .* *\''
    )
    for done in (inspect, env, run, default_run, files):
        assert done.returncode == 0, done.stderr
    metadata = json.loads(inspect.stdout)["data"]["attributes"]
    # Per path by design: the build date, and the converter (the fast path's gzip is libdeflate's).
    per_path = (BUILD_DATE_LABEL, LABEL_CONVERTER)
    labels = {key: value for key, value in metadata.pop("labels").items() if key not in per_path}
    metadata["deffile"] = [line for line in metadata["deffile"].splitlines() if LABEL_CONVERTER not in line]
    variables = sorted(
        line
        for line in env.stdout.splitlines()
        if not line.startswith(("APPTAINER_CONTAINER=", "SINGULARITY_CONTAINER="))
    )
    return {
        "labels": labels,
        "metadata": metadata,
        "env": variables,
        "run": run.stdout,
        "default_run": default_run.stdout,
        "files": [
            line for line in files.stdout.splitlines() if not line.endswith(("labels.json", "./Singularity"))
        ],
    }


def test_fast_and_reference_paths_give_the_same_container(small_sifs, cluster_node, small_image):
    fast, reference = (_inside(cluster_node, small_sifs[path].path) for path in ("fast", "reference"))
    assert fast == reference
    assert fast["labels"][LABEL_IMAGE_ID] == small_image.id
    assert "HPCBOX_GREETING=hello world" in fast["env"]
    assert fast["run"].strip() == "tool one two three"
    assert fast["default_run"].strip() == "tool --flag x y"


def test_fast_path_payload_is_reproducible(small_image, small_sifs, sif_cache, apptainer_helper):
    again = _convert(small_image, sif_cache / "fast-again")
    helper = Apptainer("container", apptainer_helper)
    assert rootfs_sha256(again.path, helper) == rootfs_sha256(small_sifs["fast"].path, helper)


# What a layer can say about the ones below it (a deleted file, a folder replaced whole, a hard link), a
# name that needs quoting, and a source date older than every file, so that every time is clamped.
LAYERED_DOCKERFILE = """\
ARG BASE
FROM ${BASE}
RUN mkdir -p /opt/data/old && touch /opt/data/old/gone /opt/data/kept && ln /opt/data/kept /opt/data/kept-link
RUN rm /opt/data/kept-link /etc/debian_version && rm -rf /opt/data/old && mkdir /opt/data/old \\
    && touch /opt/data/old/new '/opt/data/a "quoted" name' && ln /opt/data/old/new /opt/data/old/same
LABEL io.hpcbox.source-date-epoch=1700000000
"""


@pytest.fixture(scope="module")
def layered_image(docker_engine, run_id, tmp_path_factory):
    from hpcbox.tools import docker
    from tests.fixtures.debian import pinned_base
    from tests.fixtures.images import build_dockerfile

    ref = f"{run_id}/sif-layered:1"
    build_dockerfile(LAYERED_DOCKERFILE, ref, tmp_path_factory.mktemp("sif-layered"), pinned_base())
    info = docker.image(ref)
    assert info is not None
    yield SimpleNamespace(ref=ref, id=info.id)
    docker.remove_image(ref)


def test_layers_unpacked_from_docker_save_give_the_same_sif_as_the_engines_own(
    layered_image, sif_cache, apptainer_helper, monkeypatch
):
    """Where the helper cannot read the engine's overlay2 folders, `docker save` is unpacked instead:
    the same SIF, byte for byte. Deleted files stay deleted, a replaced folder shows only its new
    contents, and every time is clamped to the image's source date."""
    from hpcbox.sif import rootfs
    from hpcbox.sif.verify import squashfs_files

    from_engine = _convert(layered_image, sif_cache / "layered-engine")
    monkeypatch.setattr(rootfs, "engine_layers", lambda raw: None)  # as on an engine without overlay2
    from_save = _convert(layered_image, sif_cache / "layered-saved")
    assert from_save.sha256 == from_engine.sha256

    work = sif_cache / "layered-files"
    work.mkdir()
    files = squashfs_files(from_engine.path, Apptainer("container", apptainer_helper), work)
    assert "etc/debian_version" not in files and "opt/data/kept-link" not in files
    assert "opt/data/old/gone" not in files and files["opt/data/old/new"][0] == "file"
    assert files['opt/data/a "quoted" name'][0] == "file"
    assert max(int(fields[4]) for fields in files.values()) == 1700000000
    assert files['opt/data/a "quoted" name'][4] == files["opt/data/old"][4] == "1700000000"  # built later
    assert files["etc/passwd"][2] == "0:0" and files[".singularity.d/runscript"][2] == "0:0"


def test_a_helper_whose_mksquashfs_cannot_clamp_every_time_is_refused_leaving_no_sif(
    layered_image, apptainer_helper, run_id, tmp_path, monkeypatch
):
    """mksquashfs 4.6 (trixie's) clamps a folder's time and then skips everything in it: its SIF would
    record when it was built. Through a helper of one's own with it, the conversion stops and says so."""
    from hpcbox.tools import docker
    from tests.fixtures.images import build_dockerfile

    ref = f"{run_id}/helper-old-mksquashfs:1"
    dockerfile = (
        "ARG BASE\nFROM ${BASE}\nRUN apt-get -o Acquire::Check-Valid-Until=false update -qq "
        "&& apt-get install -y -qq --allow-downgrades squashfs-tools/trixie && rm -rf /var/lib/apt/lists/*\n"
    )
    build_dockerfile(dockerfile, ref, tmp_path, apptainer_helper)
    try:
        version = docker.run_once(ref, ["mksquashfs", "-version"], what="ask mksquashfs its version")
        assert version.startswith("mksquashfs version 4.6"), version  # trixie's, older than 4.7
        monkeypatch.setenv("HPCBOX_APPTAINER_HELPER", ref)
        with pytest.raises(HpcboxError) as refused:
            _convert(layered_image, tmp_path / "cache")
        assert re.fullmatch(
            r"mksquashfs skipped clamping the time of \d+ files, so the SIF would record when it was built "
            r"\((\S+) already exists as a non directory\.\.  Ignoring \1/\S+!\)",
            refused.value.message,
        ), refused.value.message
        assert "4.7 or later" in refused.value.hint
        assert list((tmp_path / "cache").rglob("*.sif")) == []
    finally:
        docker.remove_image(ref)


def test_the_fast_paths_sif_is_what_apptainer_sif_writes_byte_for_byte(
    small_sifs, sif_cache, apptainer_helper
):
    """mksquashfs writes straight into a SIF laid out by `apptainer sif` around a placeholder: apart from
    the per-run header fields hpcbox fixes anyway, the file is what `apptainer sif new/add` makes of the
    same four objects."""
    from hpcbox.sif.convert import normalise_header
    from hpcbox.tools.apptainer import Command

    fast = small_sifs["fast"]
    work = sif_cache / "assembled"
    work.mkdir()
    shutil.copyfile(fast.path, work / "fast.sif")
    helper = Apptainer("container", apptainer_helper)
    dump = [
        Command("apptainer", ("sif", "dump", str(i), "fast.sif"), stdout=f"object-{i}") for i in (1, 2, 3, 4)
    ]
    info = [Command("apptainer", ("sif", "info", str(i), "fast.sif"), stdout=f"info-{i}") for i in (1, 2, 3)]
    helper.script([*dump, *info], work, what="take the fast SIF's objects apart")
    add = ("sif", "add", "--groupid", "1")
    steps = [Command("apptainer", ("sif", "new", "again.sif"))]
    for i, datatype in ((1, 1), (2, 6), (3, 6)):
        name = re.search(r"Name:\s*(\S+)", (work / f"info-{i}").read_text())[1]
        steps.append(
            Command(
                "apptainer",
                (*add, "--datatype", str(datatype), "--filename", name, "again.sif", f"object-{i}"),
            )
        )
    partition = ("--datatype", "4", "--partfs", "1", "--parttype", "2", "--partarch", "2")
    steps.append(Command("apptainer", (*add, *partition, "again.sif", "object-4")))
    helper.script(steps, work, what="assemble the same objects with apptainer sif")
    header = (work / "fast.sif").read_bytes()[:128]
    normalise_header(work / "again.sif", int.from_bytes(header[64:72], "little"), "any")
    with (work / "again.sif").open("r+b") as again:
        again.seek(48)
        again.write(header[48:64])  # the id hpcbox derives from the image's content
    assert file_sha256(work / "again.sif") == fast.sha256


# Both squashfs files of the same folder, by libdeflate and by zlib: unsquashed, the same files.
_GZIP_BOTH_WAYS = f"""
set -e
mkdir -p tree && cp -a /usr/share/perl5 /usr/share/doc tree/
for how in libdeflate zlib; do
    if [ "$how" = libdeflate ]; then preload={ZLIB_LIBDEFLATE}; else preload=; fi
    LD_PRELOAD=$preload mksquashfs tree "$how.sqfs" -noappend -quiet -no-progress -comp gzip \\
        -Xcompression-level 1 -all-time 0 -mkfs-time 0
    unsquashfs -q -no-progress -d "$how" "$how.sqfs" >/dev/null
done
diff -r libdeflate zlib
unsquashfs -stat libdeflate.sqfs | grep -i '^compression'
"""


def test_gzip_in_the_fast_path_is_libdeflates_and_inflates_to_the_same_files(apptainer_helper, tmp_path):
    """mksquashfs's gzip goes through apptainer/zlib-libdeflate.c: other bytes than zlib's (so it is in
    effect), the same files once zlib's own unsquashfs inflates them."""
    stdout = Apptainer("container", apptainer_helper).run(
        "sh", ["-c", _GZIP_BOTH_WAYS], tmp_path, what="squash a folder with libdeflate and with zlib"
    )
    assert stdout.split() == ["Compression", "gzip"]
    by_libdeflate, by_zlib = (
        (tmp_path / "libdeflate.sqfs").read_bytes(),
        (tmp_path / "zlib.sqfs").read_bytes(),
    )
    assert by_libdeflate[:4] == by_zlib[:4] == b"hsqs" and by_libdeflate != by_zlib


def test_gzip_options_libdeflate_does_not_serve_stop_mksquashfs(apptainer_helper, tmp_path):
    """Whole blocks at the default window and strategy are all zlib-libdeflate.c serves: anything else is
    refused, never quietly compressed otherwise than asked (zlib itself takes the same options)."""
    (tmp_path / "tree").mkdir()
    (tmp_path / "tree" / "file").write_text("hpcbox " * 10000)
    helper = Apptainer("container", apptainer_helper)
    squash = "LD_PRELOAD=$0 mksquashfs tree out.sqfs -noappend -quiet -comp gzip -Xwindow-size 12"
    helper.run("sh", ["-c", squash, ""], tmp_path, what="squash with a smaller window, by zlib")
    with pytest.raises(HpcboxError) as error:
        helper.run("sh", ["-c", squash, ZLIB_LIBDEFLATE], tmp_path, what="squash with a smaller window")
    assert "compressor_init failed" in error.value.details


def test_a_helper_of_ones_own_without_the_shim_still_converts_and_claims_no_libdeflate(
    small_image, helper_without_libdeflate, tmp_path, monkeypatch
):
    """HPCBOX_APPTAINER_HELPER may name a helper image built without zlib-libdeflate.so: its mksquashfs
    keeps zlib's gzip, and the SIF's converter label does not claim libdeflate."""
    monkeypatch.setenv("HPCBOX_APPTAINER_HELPER", helper_without_libdeflate)
    by_zlib = _convert(small_image, tmp_path / "cache")
    label = Apptainer("container", helper_without_libdeflate).inspect(by_zlib.path)["labels"][LABEL_CONVERTER]
    assert re.fullmatch(r"apptainer version \S+; mksquashfs version \S+ \(\S+\)", label)


# The child runs `hpcbox sif` as a caller who is not root; "save" stands in for an engine whose overlay2
# folders the helper cannot bind, as the test above does.
_AS_CALLER = """
import sys
from hpcbox.sif import rootfs
from hpcbox.cli import main
if sys.argv.pop(1) == "save":
    rootfs.engine_layers = lambda raw: None
main()
"""


def _unused_id() -> int:
    import grp
    import pwd

    taken = {entry.pw_uid for entry in pwd.getpwall()} | {entry.gr_gid for entry in grp.getgrall()}
    return next(candidate for candidate in range(40000, 60000) if candidate not in taken)


@pytest.fixture
def caller_workspace(run_id):
    """A project folder owned by a uid that is neither root nor in /etc/passwd, under /var/tmp (the
    suite's own temporary folders sit in root's 0700 home)."""
    uid = _unused_id()
    workspace = Path(tempfile.mkdtemp(prefix=f"{run_id}-caller-", dir="/var/tmp"))
    (workspace / "pyproject.toml").write_text('[project]\nname = "caller"\n')
    for path in (workspace, workspace / "pyproject.toml"):
        os.chown(path, uid, uid)
    yield uid, workspace
    shutil.rmtree(workspace)


@pytest.mark.parametrize("layers", ["engine", "save"])
def test_a_caller_who_is_not_root_gets_the_same_sif_and_leaves_nothing_of_roots(
    layers, caller_workspace, small_image, small_sifs
):
    """A user in the docker group converts without root: the helper runs as root, and what it writes that
    hpcbox edits afterwards (the metadata, the SIF) is handed back, what must stay root's it removes
    itself. The caller keeps only DAC_READ_SEARCH, to read this checkout and interpreter where a 0700
    home holds them: it writes nothing it does not own, which is where a non-root caller failed."""
    import grp

    uid, workspace = caller_workspace
    docker_gid = grp.getgrnam("docker").gr_gid
    caps = "+dac_read_search"
    done = subprocess.run(
        [
            "setpriv",
            f"--reuid={uid}",
            f"--regid={uid}",
            f"--groups={docker_gid}",
            "--no-new-privs",
            f"--inh-caps={caps}",
            f"--ambient-caps={caps}",
            "--",
            sys.executable,
            "-c",
            _AS_CALLER,
            layers,
            "sif",
            "--image",
            small_image.ref,
        ],
        cwd=workspace,
        env={**{k: v for k, v in os.environ.items() if k != "HPCBOX_CACHE"}, "HOME": str(workspace)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    sif = Path(done.stdout.splitlines()[-1])
    assert sif.parent == workspace / ".hpcbox" / "sif"
    assert file_sha256(sif) == small_sifs["fast"].sha256
    left = sorted(path.relative_to(workspace).as_posix() for path in workspace.rglob("*"))
    (kept_digest,) = (workspace / ".hpcbox/sif" / SHA256_MEMO).iterdir()  # the SIF's, read once
    assert left == [
        ".hpcbox",
        ".hpcbox/sif",
        f".hpcbox/sif/{SHA256_MEMO}",
        f".hpcbox/sif/{SHA256_MEMO}/{kept_digest.name}",
        f".hpcbox/sif/{sif.stem}.json",
        f".hpcbox/sif/{sif.name}",
        "pyproject.toml",
    ]
    assert kept_digest.read_text().split()[1] == small_sifs["fast"].sha256
    assert {(workspace / name).stat().st_uid for name in left} == {uid}


def test_corrupted_cached_sif_is_rebuilt(small_image, small_sifs, sif_cache):
    cache = sif_cache / "corrupt"
    first = _convert(small_image, cache)
    with first.path.open("r+b") as handle:
        handle.seek(first.size // 2)
        byte = handle.read(1)
        handle.seek(first.size // 2)
        handle.write(bytes([byte[0] ^ 0xFF]))
    assert cached(small_image.id, cache=cache) is None
    rebuilt = _convert(small_image, cache)
    assert rebuilt.built is True
    hit = cached(small_image.id, cache=cache)
    assert hit is not None and (hit.path, hit.sha256) == (rebuilt.path, rebuilt.sha256)


# lz4, not xz, for an algorithm that takes no level: the same path, where xz took a minute of CPU to
# compress even the small image (the doctor's probe SIFs mount an xz SIF on every node image).
@pytest.mark.parametrize("written", ["gzip:1", "zstd:3", "lz4"])
def test_each_compression_is_its_own_cache_entry_and_runs_on_a_node(
    written, small_image, sif_cache, cluster_node
):
    compression = parse_compression(written, "--compression")
    sif = _convert(small_image, sif_cache / "compressions", compression=compression)
    assert sif.path.name.endswith(f".{written.replace(':', '-')}.sif")
    assert sif.compression == written
    listing = cluster_node.run(f"apptainer sif list {cluster_node.sif(sif.path)}")
    assert listing.returncode == 0, listing.stderr
    done = cluster_node.run(f"apptainer exec {cluster_node.sif(sif.path)} tool ok")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "tool ok"


# --- bad input -------------------------------------------------------------------------------------


def test_image_not_built_is_one_line_and_leaves_nothing(tmp_path, run_id):
    env = {**os.environ, "HPCBOX_CACHE": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "invoke", "sif", "--image", f"{run_id}/missing:1"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.splitlines()[0] == f"error: image {run_id}/missing:1 is not built"
    assert not any(tmp_path.rglob("*.sif"))


def test_the_fast_path_with_the_hosts_apptainer_is_one_line(small_image, tmp_path):
    with pytest.raises(
        HpcboxError, match=r"^--engine host: the fast path mounts the image's layers"
    ) as error:
        _convert(small_image, tmp_path / "cache", engine_choice="host")
    assert "--path reference" in error.value.hint
    assert not (tmp_path / "cache").exists()


def test_not_enough_disk_is_refused_before_starting(small_image, tmp_path, monkeypatch):
    import shutil

    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda path: real(path)._replace(free=1 << 20))
    with pytest.raises(HpcboxError, match="not enough disk space") as error:
        _convert(small_image, tmp_path / "cache")
    assert "HPCBOX_CACHE" in error.value.hint
    assert not any((tmp_path / "cache").rglob("*"))


def test_mksquashfs_refusing_its_options_ends_the_conversion_with_its_own_words(small_image, tmp_path):
    """mksquashfs exits at once, after the helper mounted the image's layers: nothing hangs, and no SIF
    or work folder is left."""
    from hpcbox.sif.compression import SifCompression

    started = time.monotonic()
    with pytest.raises(HpcboxError) as error:
        _convert(
            small_image, tmp_path / "cache", compression=SifCompression("zstd", 99), engine_choice="container"
        )
    assert "mksquashfs" in error.value.message and "compression" in str(error.value).lower()
    assert time.monotonic() - started < 60
    assert not any((tmp_path / "cache").rglob("*.sif")) and not any((tmp_path / "cache").glob(".convert-*"))


def test_helper_that_cannot_start_is_one_line(tmp_path, run_id):
    missing = Apptainer("container", f"{run_id}/no-such-helper:1")
    with pytest.raises(HpcboxError) as error:
        missing.run("apptainer", ["--version"], tmp_path, what="ask apptainer its version")
    assert error.value.message.startswith("the Apptainer helper container cannot start:")
    assert "\n" not in error.value.message and error.value.hint


def test_a_helper_pin_debian_no_longer_serves_makes_an_off_lock_helper_and_sif_which_strict_lock_refuses(
    docker_engine, small_image, tmp_path, monkeypatch
):
    """Debian moving on (sid replaces versions within days) is simulated by a pin it never served."""
    from hpcbox.build import baseimage, offlock
    from hpcbox.sif import helper as sif_helper
    from hpcbox.tools import docker
    from tests.fixtures.debian import base_lock_served_today

    # Every lock the helper stands on as Debian serves it today, so that apptainer's pin below is the only
    # one moved, on any day.
    committed = baseimage.own_lock()
    today = base_lock_served_today(committed)
    monkeypatch.setattr(baseimage, "own_lock", lambda: today)
    # bootstrapped now where Debian has moved, so that what the helper says below is the helper's alone
    baseimage.ensure_base(lock=today, on_line=lambda _: None, say=lambda _: None)
    lock, build_lock = tmp_path / "apt-helper.txt", tmp_path / "apt-helper-build.txt"
    shutil.copy(sif_helper.HELPER_LOCK, lock)
    shutil.copy(sif_helper.HELPER_BUILD_LOCK, build_lock)
    monkeypatch.setattr(sif_helper, "HELPER_LOCK", lock)
    monkeypatch.setattr(sif_helper, "HELPER_BUILD_LOCK", build_lock)
    moved = sif_helper.moved_helper_pins(baseimage.base_ref(lock=committed))
    for each in (lock, build_lock):
        each.write_text(
            offlock.follow(each.read_text(), [pin for pin in moved if pin.lock.endswith(each.name)])
        )
    gone = re.sub(r"(?m)^apptainer=.*$", "apptainer=1.4.5-0+hpcbox.gone", lock.read_text())
    monkeypatch.delenv("HPCBOX_APPTAINER_HELPER", raising=False)
    moved = (
        r"apptainer 1\.4\.5-0\+hpcbox\.gone -> [^ ;]+ \(src/hpcbox/sif/helper-image/lock/apt-helper\.txt\)"
    )
    # Pins resolved where the snapshot archive answered record its time; the build turns to it first,
    # and says why not where it cannot be reached. --strict-lock then refuses, building nothing.
    lock.write_text(gone.replace("\napptainer=", "\n# snapshot: 20261123T100000Z\napptainer=", 1))
    assert sif_helper.helper_snapshot() == "20261123T100000Z"
    monkeypatch.setenv("HPCBOX_SNAPSHOT_URL", "http://127.0.0.1:9")
    said: list[str] = []
    with pytest.raises(HpcboxError) as refused:
        sif_helper.ensure_helper(strict=True, on_line=lambda _: None, say=said.append)
    assert re.fullmatch(
        f"Debian moved on: {moved}; --strict-lock refuses an off-lock SIF helper", refused.value.message
    )
    assert len(said) == 2 and said[0] == (
        f"hpcbox: building the Apptainer helper image {sif_helper.helper_ref()} "
        "(once: Apptainer and mksquashfs from Debian)"
    )
    assert said[1].startswith(
        "hpcbox: Debian no longer serves apptainer 1.4.5-0+hpcbox.gone, pinned in "
        "src/hpcbox/sif/helper-image/lock/apt-helper.txt, and the snapshot archive cannot be reached "
        "(http://127.0.0.1:9/archive/debian/20261123T100000Z/dists/sid/Release: "
    )
    assert (
        docker.image(sif_helper.helper_ref()) is None
        and offlock.stand_in(sif_helper.helper_ref(), sif_helper.HELPER_REPOSITORY) is None
    )
    # Without it, the helper is built with what Debian serves, labelled with the pin that moved.
    lock.write_text(gone)
    locked = sif_helper.helper_ref()
    helper = sif_helper.ensure_helper(on_line=lambda _: None, say=said.append)
    try:
        assert helper != locked and docker.image(locked) is None
        labels = docker.image(helper).labels
        assert re.fullmatch(moved, labels[offlock.LABEL]) and labels[offlock.LABEL_OF] == locked
        assert sif_helper.ensure_helper(say=said.append) == helper  # found again, not rebuilt
        sif = build_sif(small_image, cache=tmp_path / "cache", say=said.append, on_line=lambda _: None)
        assert re.fullmatch(moved, sif.off_lock)
        attributes = Apptainer("container", helper).inspect(sif.path)
        assert attributes["labels"][LABEL_OFF_LOCK] == sif.off_lock
        line = f"hpcbox: Debian moved on: {moved}; this build is off-lock: run hpcbox lock"
        assert any(re.fullmatch(line, each) for each in said), said
        with pytest.raises(HpcboxError, match="refuses an off-lock SIF"):
            build_sif(small_image, cache=tmp_path / "cache", strict_lock=True, say=said.append)
        # converting anew under --strict-lock: refused before anything is written
        with pytest.raises(HpcboxError, match="refuses an off-lock SIF helper"):
            build_sif(small_image, cache=tmp_path / "strict", strict_lock=True, say=said.append)
        assert not (tmp_path / "strict").exists()
    finally:
        docker.remove_image(helper)
