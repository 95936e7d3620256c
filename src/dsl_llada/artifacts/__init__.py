"""What a command writes and reads back: atomic writes, output folders, records, locks, fingerprints."""
