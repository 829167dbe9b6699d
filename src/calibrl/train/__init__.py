"""Trainers: the compact CPU trainer (``local``) and the OpenRLHF backend (``openrlhf``)."""
