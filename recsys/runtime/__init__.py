"""Runtime helpers every floor of the library may use: atomic writes (and the cleanup of their temporaries), file
locks, checkpoint files, devices and precision, config validation."""
