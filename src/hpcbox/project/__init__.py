"""The user's project: [tool.hpcbox] in pyproject.toml, the container command, dependency sources,
`hpcbox init`."""
