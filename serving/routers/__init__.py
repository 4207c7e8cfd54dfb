"""One router per resource: recommendations, items, events, health."""
