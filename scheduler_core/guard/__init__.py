"""Guards on a GPU node, as pure logic: SysMonitor's health states (``sysmonitor``) and the
xCUDA pacing controller's maths (``xcuda_control``, mirrored by the C library)."""
