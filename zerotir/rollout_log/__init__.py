"""Rollouts on disk and on screen: records per trajectory, a background writer, Markdown / terminal views."""
