"""Applying a family's per-device settings at prepare time (and undoing them at unprepare).

A family's DeviceSetup gets the claim's (published Device, DeviceSettings) pairs and returns the environment
the claim's CDI spec carries and what it applied; the applied record is stored in the checkpoint, re-applied
after a reboot (hardware forgets) and handed back to `revert` at unprepare. A setting that cannot be applied
is a SetupError: the claim's prepare error, never "recorded" as if applied. This base applies nothing: the
setup of a family without settings.

Some settings change the device itself (GPU time-slicing), and so every claim holding it; the family names them
in `DeviceFamily.hardware_settings`. Who may set them, and when they are reverted, is state.py's rule (one claim
owns a device's settings); `hardware_changes` and `admin_access_refusal` are shared with `eks-dra plan`.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

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

    def revert(self, applied: dict, keep: Collection[str] = frozenset()) -> dict[str, dict]:
        """Undo what apply() did for a claim that is being unprepared, except on the devices named in `keep`
        (still held by another claim). Returns, for each kept device that apply() changed, the applied record of
        that device alone: what a later `revert` undoes once the device is free."""
        return {}


def hardware_changes(settings: DeviceSettings, hardware_settings: Collection[str]) -> dict[str, object]:
    """The settings of `settings` that change the device itself (`hardware_settings`: the family's keys)."""
    return {k: v for k, v in settings.values if k in hardware_settings}


def describe(changes: dict[str, object]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(changes.items()))


def admin_access_refusal(request: str, device: str, changes: dict[str, object]) -> str:
    """Why an adminAccess request may not carry a device-changing setting (prepare's and the planner's text)."""
    return (f"request {request} has adminAccess and its config sets {describe(changes)} on device {device}: an "
            "adminAccess claim never changes a device's settings (they belong to the claim whose workload uses the "
            "device); remove the setting from the claim's or its DeviceClass's config, or list only requests "
            "without adminAccess in that config entry's requests")
