"""Applying a family's per-device settings at prepare time (and undoing them at unprepare).

A family's DeviceSetup gets the claim's (published Device, DeviceSettings) pairs and returns the environment
the claim's CDI spec carries and what it applied; the applied record is stored in the checkpoint, re-applied
after a reboot (hardware forgets) and handed back to `revert` at unprepare. A setting that cannot be applied
is a SetupError: the claim's prepare error, never "recorded" as if applied. This base applies nothing: the
setup of a family without settings.
"""

from __future__ import annotations

from collections.abc import Iterable

from .configs import DeviceSettings


class SetupError(RuntimeError):
    pass


class DeviceSetup:
    mode = "none"  # how settings are applied, stored with what was applied

    def changes_hardware(self, settings: Iterable[DeviceSettings]) -> bool:
        """Whether apply() would change device state that must be reverted (not just recorded)."""
        return False

    def apply(self, devices: list[tuple[object, DeviceSettings]]) -> tuple[dict[str, str], dict]:
        """Apply settings to (published Device, settings) pairs; returns (claim env, applied settings)."""
        return {}, {}

    def revert(self, applied: dict) -> None:
        """Undo what apply() did for a claim that is being unprepared."""
