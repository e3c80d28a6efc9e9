"""Where a project's tasks.py finds hpcbox's commands: `from hpcbox.tasks import collection` (the two lines
`hpcbox init` writes). The commands themselves are in hpcbox.cli.tasks."""

from hpcbox.cli.tasks import collection, friendly, say, task

__all__ = ["collection", "friendly", "say", "task"]
