"""Runtime helpers every floor of the library may use: atomic writes, checkpoint files, devices and precision."""
