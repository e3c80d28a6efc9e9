"""The image: its Debian base, the Docker build, the locks, off-lock builds, provenance."""
