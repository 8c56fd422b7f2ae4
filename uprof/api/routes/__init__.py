"""One router per resource; ``uprof.api.app`` assembles them."""
