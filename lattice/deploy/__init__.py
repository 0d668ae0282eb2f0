"""Deployment profiles: embedded (files on one machine) or scale-out (services), see profile.py."""
