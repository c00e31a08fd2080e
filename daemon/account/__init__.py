"""The account's credentials over time: the credentials file and the token rotation, and
the service client built with them (assembly.py) for the daemon and for the commands."""

from daemon.account.credentials_file import CredentialsFileError, Saved
from daemon.account.rotation import RotationRefused, RotationTiming, Rotator

__all__ = ["CredentialsFileError", "RotationRefused", "RotationTiming", "Rotator", "Saved"]
