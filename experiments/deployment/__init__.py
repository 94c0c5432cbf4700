"""Deployment on real SuperLinks and SuperNodes: local federations, their commands, certificates and keys, kits."""
