"""hpcbox.testing: a project's own tests rehearse its jobs on a mini Slurm cluster of their session.

With hpcbox installed (`pip install "hpcbox[testing]"`), pytest loads the plugin (hpcbox.testing.plugin,
through the `pytest11` entry point) and any test may ask for the `hpcbox_cluster` fixture:

    def test_the_job_runs_on_slurm(hpcbox_cluster):
        job = hpcbox_cluster.submit(["--epochs", "1"], time="10")
        assert job.wait().state == "COMPLETED"
        assert (job.fetch() / "metrics.jsonl").exists()

docs/testing-your-project.md says how to shape the cluster like a site and pick its Slurm version.
Importing this package loads neither the Docker SDK nor the rest of hpcbox.
"""

from hpcbox.testing.cluster import ClusterSettings, SessionCluster

__all__ = ["ClusterSettings", "SessionCluster"]
