"""The HTTP edge: the one public door, composing the routes of acceptance and delivery (DESIGN §6)."""
