"""What keeps a long run alive and alone: a bad step rolled back (`rollback`), one writer per workdir (`lease`), a lost
host noticed in bounded time (`watchdog`)."""
