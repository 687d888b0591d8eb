"""Root supervisor, OTP strategies and child specs, spawning and the retire ladder."""
