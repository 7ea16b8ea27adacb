"""Keys derived from the secret key stay what they were: stored credentials still open, receipts still verify.

Known answers, computed when the three derivations moved to their one owner (`tether.keys`): a change
of salt, info, length or hash would orphan every key stored and every receipt signed before it.
"""

from django.test import override_settings

from instances import credentials
from reviews import receipts, services
from tether import keys

SECRET = "a fixed secret"


@override_settings(SECRET_KEY=SECRET, SECRET_KEY_FALLBACKS=["an older one"], TETHER_REVIEW_SAMPLE_SEED="")
def test_each_purpose_derives_the_key_it_always_did():
    assert receipts.signing_key().hex() == "d50b8f146780a92d6f46bc1f9cfc6cbb4bcba99b41fce3732efaf89c4d1cce26"
    assert services.sample_seed().hex() == "4b6455fb67e09df2faa88b3ed37921d27c4c1e8c39001a8c89d25a45bf1ea4dd"
    fernet = credentials._fernet_for(SECRET)
    assert (fernet._signing_key.hex(), fernet._encryption_key.hex()) == (
        "87cb7b12bf059ea15063fe71bb80722b", "01e91ec3349beff80afda5a86cc3dbba"
    )
    assert keys.secrets() == [SECRET, "an older one"]


def test_purposes_and_secrets_give_unrelated_keys():
    derived = {
        keys.derive(b"tether.receipts", b"tether receipt signing v1", SECRET),
        keys.derive(b"tether.reviews", b"tether review sampling v1", SECRET),
        keys.derive(b"tether.receipts", b"tether receipt signing v1", "another secret"),
    }
    assert len(derived) == 3 and all(len(key) == 32 for key in derived)
