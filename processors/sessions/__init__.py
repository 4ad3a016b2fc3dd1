"""Sessions: the episode distiller, its batch and how long a closed session is remembered."""
