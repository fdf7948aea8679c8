"""Questions across hardware: the best layout per device and where the winner changes (``compare``)."""
