"""`burn.py MB SECONDS`: hold MB of memory, then spin one CPU for SECONDS (capture.sh's jobs)."""

import sys
import time

megabytes, seconds = int(sys.argv[1]), float(sys.argv[2])
block = bytearray(megabytes * 1024 * 1024)
for offset in range(0, len(block), 4096):
    block[offset] = 1  # touch every page: resident, so sacct's MaxRSS sees it
end = time.monotonic() + seconds
count = 0
while time.monotonic() < end:
    count += 1
