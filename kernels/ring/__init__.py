"""Cursor moves of the ring contract on the device (reference: replayssm.ring), and the slot copy."""
