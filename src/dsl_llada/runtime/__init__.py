"""The process: OpenMP/allocator settings made before torch loads, threads, SIGTERM, the environment record."""
