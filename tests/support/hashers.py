"""The suite's password hasher: Django's PBKDF2 at a test's strength.

The iteration count is written into every hash, so a user made in the test process signs in on a
server or worker the test starts (which keeps Django's default hashers), and Django there upgrades the
hash as it would any weak one. A user costs well under a millisecond instead of ~0.6 s of CPU.
"""

from django.contrib.auth.hashers import PBKDF2PasswordHasher


class QuickPBKDF2(PBKDF2PasswordHasher):
    iterations = 1000
