"""What a setting is (``setting``) and references to a user's own code (``entry``); every setting's
default and meaning in ``settings.toml``."""
