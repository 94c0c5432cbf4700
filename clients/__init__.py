"""Flower ClientApps: unpack records, call fedsketch, pack records.

``clients/client_app.py`` is the ClientApp. ``bridge/runtime/`` runs it in ways Flower does not by
default (the in-process simulation backend, the device launcher); each of them patches a Flower
internal and is installed only by its own explicit switch, never by importing the ClientApp.
"""
