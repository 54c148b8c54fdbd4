"""Alerts (issue 19): operators are told by signed webhook and by e-mail when a queue opens, pauses, fills
past a threshold, closes, when admission stalls with people waiting, and when the protected site's health
crosses its limits."""
