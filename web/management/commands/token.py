"""`manage.py token create|list|revoke`: an operator's view of API tokens (secrets shown once, at creation)."""

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from loops.models import ApiToken
from web.auth import TOKEN_DAYS_MAX, make_token, revoke_token


class Command(BaseCommand):
    help = "Create, list or revoke API tokens. A revoked token is refused from the next request on."

    def add_arguments(self, parser):
        actions = parser.add_subparsers(dest="action", required=True)
        create = actions.add_parser("create", help="print a new token for USERNAME (shown once)")
        create.add_argument("username")
        create.add_argument("--name", default="", help="what uses the token, e.g. 'ci' (at most 100 characters)")
        create.add_argument("--days", type=int, default=None, help=f"expire after DAYS (1 to {TOKEN_DAYS_MAX}; default: never)")
        listing = actions.add_parser("list", help="list tokens (never their secrets)")
        listing.add_argument("username", nargs="?", help="only this user's tokens")
        revoke = actions.add_parser("revoke", help="revoke the token with this id (see `token list`)")
        revoke.add_argument("token_id", type=int)

    def handle(self, action, **options):
        getattr(self, f"handle_{action}")(**options)

    def handle_create(self, username, name, days, **options):
        user = _user(username)
        try:
            self.stdout.write(make_token(user, name=name, days=days))
        except ValueError as exc:
            raise CommandError(str(exc)) from None

    def handle_list(self, username=None, **options):
        tokens = ApiToken.objects.select_related("user").order_by("user__username", "-created_at", "-pk")
        if username:
            tokens = tokens.filter(user=_user(username))
        now = timezone.now()
        self.stdout.write(f"{'id':>5}  {'user':<16} {'name':<24} {'token':<12} {'created':<17} {'last used':<17} expires")
        for token in tokens:
            expires = "never"
            if token.expires_at is not None:
                expires = _when(token.expires_at) + (" (expired)" if token.expires_at <= now else "")
            self.stdout.write(
                f"{token.pk:>5}  {token.user.get_username():<16.16} {token.name or '-':<24.24} {token.prefix + '…':<12} "
                f"{_when(token.created_at):<17} {_when(token.last_used_at):<17} {expires}"
            )

    def handle_revoke(self, token_id, **options):
        revoked = revoke_token(token_id=token_id)
        if revoked is None:
            raise CommandError(f"no API token with id {token_id}; `python manage.py token list` shows them")
        self.stdout.write(f"revoked token {token_id} ({revoked.prefix}…) of {revoked.user.get_username()}")


def _user(username: str):
    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        raise CommandError(f"no user named {username!r}")
    return user


def _when(moment) -> str:
    return "-" if moment is None else f"{moment:%Y-%m-%d %H:%M}"
