"""The lowest layer: what every other layer may import (statuses, settings, value types)."""
