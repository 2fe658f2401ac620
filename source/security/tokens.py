"""JSON Web Tokens for authentication, as Pulsar's token authentication: what they hold, how
they are signed, how a key is kept in a file, and what a validator refuses.

**Tokens.** A token is a signed JWT (RFC 7519) in the compact form `header.payload.signature`
(base64url JSON). Its claims: `sub`, the role it authenticates as (a non-empty string), and,
when it was made with an expiry, `exp` (when it stops being valid) and `iat` (when it was
made), both whole seconds since the epoch. A token made without an expiry is valid until its
key is changed (as Pulsar's); it holds `sub` only, so the same role and key give the same
token. Other claims are allowed and ignored, except that `nbf` and `iat`, when present, must
not lie in the future.

**Algorithms.** One per key, never chosen by the token:

- `HS256`: HMAC-SHA256 with a secret key (`create_secret_key`: 32 random bytes; a key shorter
  than 32 bytes is refused, RFC 7518 section 3.2). Whoever can validate can also create.
- `RS256`: RSA PKCS#1 v1.5 with SHA-256, a 2048-bit key pair (`create_key_pair("RS256")`);
  public keys below 2048 bits are refused.
- `ES256`: ECDSA on P-256 with SHA-256 (`create_key_pair("ES256")`).

With a key pair the private key creates tokens and the public key, all a broker needs,
validates them.

**Key files.** A key pair is two PEM files: the private key PKCS#8, unencrypted (written mode
0600), the public key SubjectPublicKeyInfo. A secret key file holds the key's raw bytes (what
`shadowtopic tokens create-secret-key --output F` writes) or the key in base64 (what `--base64`
writes, as Pulsar's `tokens create-secret-key --base64`): a file whose whole content, less
surrounding whitespace, is standard base64 text (A-Z a-z 0-9 + /, padded with `=`) is read as
base64; anything else is the raw key. A random raw key is base64 text by chance with
probability below 1e-19; a raw key typed by hand that is base64 text (letters and digits
only, a multiple of 4 long) is read as base64, so write hand-made keys with `--base64`'s
form or avoid such keys. A key file larger than 64 KiB is refused.

**What a validator refuses** (each with `errors.Unauthenticated` and a reason that never
includes the token or a part of it):

- a token longer than `MAX_TOKEN_CHARS` (16 KiB), before it is parsed; one that is not text;
- anything that is not a JWS compact token (three base64url parts, no padding, no
  whitespace) with a JSON object header and payload; a signature spelled other than in
  canonical base64url (a last character with unused bits set): one token, one string;
- a token whose header names another algorithm than the validator's, `none` included: the
  validator of a public key never checks an HMAC signature with that key as the secret (the
  algorithm-confusion attack), and an HS256 validator's secret may not be a PEM key;
- a `crit` or `b64` header (no JWS extension is understood: RFC 7515's crit, RFC 7797);
- a bad signature; an `exp` more than `LEEWAY_S` (5 s, for clocks a little apart) in the
  past, or an `nbf` or `iat` more than 5 s in the future; an `exp`, `nbf` or `iat` that is not
  a number;
- no `sub`, or a `sub` that is not a string, is empty or only whitespace, is longer than
  `MAX_ROLE_CHARS` (256) or holds a control character (a role is written into log lines);
- an `aud` claim not naming the validator's audience when it has one (without one, `aud` is
  not checked, as in Pulsar without `tokenAudience`).
"""
from __future__ import annotations

import base64
import binascii
import math
import os
import re
import stat
import time
import unicodedata
from dataclasses import dataclass
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.utils import base64url_decode, base64url_encode

from shadowtopic.core import errors

#: the algorithms a key can have: HS256 (secret key), RS256 and ES256 (key pairs)
ALGORITHMS = ("HS256", "RS256", "ES256")
KEY_PAIR_ALGORITHMS = ("RS256", "ES256")
SECRET_KEY_BYTES = 32
MIN_SECRET_KEY_BYTES = 32
RSA_BITS = 2048
#: seconds an `exp` may have passed (and an `nbf` or `iat` may lie ahead) for clocks apart
LEEWAY_S = 5.0
#: a longer token is refused before it is parsed (gRPC metadata is bounded at 16 KiB too)
MAX_TOKEN_CHARS = 16 * 1024
MAX_ROLE_CHARS = 256
MAX_KEY_FILE_BYTES = 64 * 1024
#: the algorithm names of RFC 7518 (and EdDSA): a refusal names one of these, never other text
JWS_ALGORITHMS = frozenset({"none", "HS256", "HS384", "HS512", "RS256", "RS384", "RS512",
                            "ES256", "ES384", "ES512", "PS256", "PS384", "PS512", "EdDSA"})
#: headers a token may not be made with: `alg` is the key's, and none of these is understood
RESERVED_HEADERS = frozenset({"alg", "b64", "crit"})

_BASE64 = re.compile(rb"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?")
#: a JWS compact token: header.payload.signature, each base64url without padding (an empty
#: signature is `alg: none`'s, refused for its algorithm)
_COMPACT = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*")
MALFORMED = "malformed token (not a signed JWT: header.payload.signature, base64url)"


@dataclass(frozen=True)
class Claims:
    """What a valid token says: the role it authenticates as, and when it expires (seconds
    since the epoch; None: never)."""
    role: str
    expires_at: float | None


# ---- keys ------------------------------------------------------------------------------------

def create_secret_key() -> bytes:
    """A new HS256 secret key: 32 random bytes."""
    return os.urandom(SECRET_KEY_BYTES)


def create_key_pair(algorithm: str = "RS256") -> tuple[bytes, bytes]:
    """A new key pair for `algorithm` (RS256: RSA 2048 bits; ES256: ECDSA P-256) as
    (private key PEM, PKCS#8 unencrypted; public key PEM, SubjectPublicKeyInfo)."""
    private: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey
    if algorithm == "RS256":
        private = rsa.generate_private_key(public_exponent=65537, key_size=RSA_BITS)
    elif algorithm == "ES256":
        private = ec.generate_private_key(ec.SECP256R1())
    else:
        raise errors.InvalidArgument(f"no key pair for algorithm {algorithm!r}: "
                                     f"{' or '.join(KEY_PAIR_ALGORITHMS)}")
    private_pem = private.private_bytes(serialization.Encoding.PEM,
                                        serialization.PrivateFormat.PKCS8,
                                        serialization.NoEncryption())
    public_pem = private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return private_pem, public_pem


def key_algorithm(pem: bytes) -> str:
    """RS256 or ES256: the algorithm of a PEM key (private or public) of a key pair."""
    key = _load_pem(pem)
    if isinstance(key, (rsa.RSAPrivateKey, rsa.RSAPublicKey)):
        return "RS256"
    if isinstance(key, (ec.EllipticCurvePrivateKey, ec.EllipticCurvePublicKey)):
        return "ES256"
    raise errors.InvalidArgument(f"a {type(key).__name__} is no RS256 or ES256 key")


def _load_pem(pem: bytes) -> Any:
    """The key a PEM holds, private or public (an encrypted private key is refused)."""
    if b"PRIVATE KEY-----" in pem:
        try:
            return serialization.load_pem_private_key(pem, password=None)
        except TypeError:
            raise errors.InvalidArgument("the private key is encrypted: give it unencrypted"
                                         ) from None
        except ValueError:
            raise errors.InvalidArgument("not a PEM private key") from None
    try:
        return serialization.load_pem_public_key(pem)
    except ValueError:
        raise errors.InvalidArgument("not a PEM key (expected -----BEGIN PUBLIC KEY-----"
                                     " or -----BEGIN PRIVATE KEY-----)") from None


def _checked_secret(key: bytes) -> bytes:
    if not isinstance(key, bytes):
        raise errors.InvalidArgument("an HS256 secret key is bytes")
    if b"-----BEGIN" in key or key.startswith((b"ssh-", b"ecdsa-sha2-")):
        # a public key as an HMAC secret is the algorithm-confusion attack's way in
        raise errors.InvalidArgument("an HS256 secret key may not be a PEM or SSH key")
    if len(key) < MIN_SECRET_KEY_BYTES:
        raise errors.InvalidArgument(f"the secret key is {len(key)} bytes: HS256 needs at "
                                     f"least {MIN_SECRET_KEY_BYTES}")
    return key


def _signing_key(key: bytes, algorithm: str) -> Any:
    """The key `create_token` signs with: the secret, or the private key object, of the
    algorithm's kind."""
    _check_algorithm(algorithm)
    if algorithm == "HS256":
        return _checked_secret(key)
    loaded = _load_pem(key)
    want = rsa.RSAPrivateKey if algorithm == "RS256" else ec.EllipticCurvePrivateKey
    if not isinstance(loaded, want):
        raise errors.InvalidArgument(f"{algorithm} tokens are signed with a "
                                     f"{_kind(algorithm)} private key")
    _check_strength(loaded.public_key(), algorithm)
    return loaded


def _verifying_key(key: bytes, algorithm: str) -> Any:
    """The key a validator checks with: the secret, or the public key object."""
    _check_algorithm(algorithm)
    if algorithm == "HS256":
        return _checked_secret(key)
    loaded = _load_pem(key)
    if isinstance(loaded, (rsa.RSAPrivateKey, ec.EllipticCurvePrivateKey)):
        raise errors.InvalidArgument("tokens are validated with the public key: give the "
                                     "public key, keep the private key with who creates them")
    want = rsa.RSAPublicKey if algorithm == "RS256" else ec.EllipticCurvePublicKey
    if not isinstance(loaded, want):
        raise errors.InvalidArgument(f"{algorithm} tokens are validated with a "
                                     f"{_kind(algorithm)} public key")
    _check_strength(loaded, algorithm)
    return loaded


def _kind(algorithm: str) -> str:
    return "RSA" if algorithm == "RS256" else "P-256 EC"


def _check_strength(public: Any, algorithm: str) -> None:
    if algorithm == "RS256" and public.key_size < RSA_BITS:
        raise errors.InvalidArgument(f"the RSA key has {public.key_size} bits: RS256 needs "
                                     f"at least {RSA_BITS}")
    if algorithm == "ES256" and not isinstance(public.curve, ec.SECP256R1):
        raise errors.InvalidArgument(f"the EC key is on {public.curve.name}: ES256 needs "
                                     "P-256 (secp256r1)")


def _check_algorithm(algorithm: str) -> None:
    if algorithm not in ALGORITHMS:
        raise errors.InvalidArgument(f"algorithm {algorithm!r} is not one of "
                                     f"{', '.join(ALGORITHMS)}")


# ---- key files -------------------------------------------------------------------------------

def read_key_file(path: str) -> bytes:
    """A key file's bytes (at most 64 KiB); a file that cannot be read is InvalidArgument."""
    try:
        with open(path, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise errors.InvalidArgument(f"key file {path}: not a regular file")
            data = f.read(MAX_KEY_FILE_BYTES + 1)
    except OSError as exc:
        raise errors.InvalidArgument(f"key file {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_KEY_FILE_BYTES:
        raise errors.InvalidArgument(f"key file {path}: larger than {MAX_KEY_FILE_BYTES} "
                                     "bytes, not a key")
    if not data:
        raise errors.InvalidArgument(f"key file {path}: empty")
    return data


def decode_secret_key(data: bytes) -> bytes:
    """A secret key file's content as the key: base64 text decoded, anything else as is."""
    text = data.strip()
    if text and _BASE64.fullmatch(text):
        try:
            return base64.b64decode(text, validate=True)
        except binascii.Error:  # (the pattern admits only what decodes)
            pass
    return data


def load_secret_key(path: str) -> bytes:
    """The HS256 secret key in file `path`: raw bytes or base64 (see the top of this module)."""
    key = decode_secret_key(read_key_file(path))
    try:
        return _checked_secret(key)
    except errors.InvalidArgument as exc:
        raise errors.InvalidArgument(f"secret key file {path}: {exc.message}") from None


def load_key_pair_file(path: str, algorithm: str | None = None) -> tuple[bytes, str]:
    """(PEM, algorithm) of a key pair's private or public key file; `algorithm` None: the
    key's own (RS256 for RSA, ES256 for P-256), else it must match the key."""
    pem = read_key_file(path)
    try:
        found = key_algorithm(pem)
    except errors.InvalidArgument as exc:
        raise errors.InvalidArgument(f"key file {path}: {exc.message}") from None
    if algorithm is not None and algorithm != found:
        raise errors.InvalidArgument(f"key file {path} holds a {_kind(found)} key, for "
                                     f"{found}, not {algorithm}")
    return pem, found


# ---- tokens ----------------------------------------------------------------------------------

def create_token(subject: str, key: bytes, algorithm: str = "HS256",
                 expiry_s: float | None = None, headers: dict[str, Any] | None = None,
                 now: float | None = None) -> str:
    """A token for role `subject`, signed with `key` (the secret for HS256, the private key
    PEM for RS256 and ES256); with `expiry_s`, valid for that many seconds from `now`
    (default: the clock), rounded up to a whole second. `headers`: more JOSE header fields
    (e.g. `kid`), never `alg`, `b64` or `crit`."""
    _check_role(subject, errors.InvalidArgument)
    signing = _signing_key(key, algorithm)
    claims: dict[str, Any] = {"sub": subject}
    if expiry_s is not None:
        if (isinstance(expiry_s, bool) or not isinstance(expiry_s, (int, float))
                or not 0 < expiry_s < math.inf):
            raise errors.InvalidArgument(f"expiry {expiry_s!r}: a number of seconds above 0")
        issued = int(time.time() if now is None else now)
        claims["iat"] = issued
        claims["exp"] = issued + math.ceil(expiry_s)
    extra = dict(headers or {})
    if RESERVED_HEADERS & extra.keys():
        raise errors.InvalidArgument(f"header {sorted(RESERVED_HEADERS & extra.keys())[0]!r} "
                                     "is not set by hand: the key's algorithm is the token's")
    return jwt.encode(claims, signing, algorithm=algorithm, headers=extra or None)


def _check_role(role: object, error: type[errors.ShadowTopicError]) -> str:
    if not isinstance(role, str):
        raise error("the token's sub (its role) is not a string")
    if not role.strip():
        raise error("the token's sub (its role) is empty")
    if len(role) > MAX_ROLE_CHARS:
        raise error(f"the token's sub (its role) is longer than {MAX_ROLE_CHARS} characters")
    if any(unicodedata.category(c) in ("Cc", "Cs") for c in role):
        raise error("the token's sub (its role) holds a control character")
    return role


#: PyJWT's refusals, most specific first, as the reason a client is told
_REASONS: tuple[tuple[type[Exception], str], ...] = (
    (jwt.ExpiredSignatureError, "token expired"),
    (jwt.ImmatureSignatureError, "token not valid yet (nbf or iat in the future)"),
    (jwt.InvalidSignatureError, "token signature does not verify (signed with another key?)"),
    (jwt.InvalidAlgorithmError, "token algorithm not accepted"),
    (jwt.InvalidAudienceError, "token audience not accepted"),
    (jwt.InvalidIssuedAtError, "token iat is not a number"),
    (jwt.MissingRequiredClaimError, "token has no sub (role) claim"),
    # PyJWT >= 2.10 checks sub's type itself
    *([(jwt.exceptions.InvalidSubjectError, "the token's sub (its role) is not a string")]
      if hasattr(jwt.exceptions, "InvalidSubjectError") else []),
    (jwt.DecodeError, MALFORMED),
)


class TokenValidator:
    """Validates tokens signed for `algorithm` with `key_material` (the secret for HS256,
    the public key PEM for RS256 and ES256); `audience`: tokens must name it in `aud`.
    A bad key or algorithm is InvalidArgument here, once; a bad token Unauthenticated."""

    def __init__(self, key_material: bytes, algorithm: str, audience: str | None = None,
                 leeway_s: float = LEEWAY_S):
        self.algorithm = algorithm
        self.audience = audience
        self.leeway_s = leeway_s
        self._key = _verifying_key(key_material, algorithm)

    @classmethod
    def from_files(cls, *, secret_key: str | None = None, public_key: str | None = None,
                   algorithm: str | None = None, audience: str | None = None
                   ) -> TokenValidator:
        """A validator from a secret key file (HS256) or a public key file (its own
        algorithm unless `algorithm` says, and then it must match)."""
        if (secret_key is None) == (public_key is None):
            raise errors.InvalidArgument("give a secret key file or a public key file")
        if secret_key is not None:
            if algorithm not in (None, "HS256"):
                raise errors.InvalidArgument(f"a secret key is for HS256, not {algorithm}")
            return cls(load_secret_key(secret_key), "HS256", audience)
        assert public_key is not None
        pem, found = load_key_pair_file(public_key, algorithm)
        return cls(pem, found, audience)

    def validate(self, token: str | bytes) -> Claims:
        """The claims of a valid token; errors.Unauthenticated, with the reason, otherwise."""
        if isinstance(token, (bytes, bytearray)):
            if len(token) > MAX_TOKEN_CHARS:
                raise errors.Unauthenticated(_too_long(len(token)))
            try:
                token = bytes(token).decode("ascii")
            except UnicodeDecodeError:
                raise errors.Unauthenticated("token is not ASCII text") from None
        if not isinstance(token, str):
            raise errors.Unauthenticated("token is not text")
        if len(token) > MAX_TOKEN_CHARS:
            raise errors.Unauthenticated(_too_long(len(token)))
        if not token:
            raise errors.Unauthenticated("empty token")
        try:
            payload = self._decode(token)
        except jwt.PyJWTError as exc:
            raise errors.Unauthenticated(_reason(exc)) from None
        except (ValueError, TypeError, OverflowError, RecursionError):
            # what an older PyJWT lets out of a malformed token (its own checks improved)
            raise errors.Unauthenticated(MALFORMED) from None
        role = _check_role(payload.get("sub"), errors.Unauthenticated)
        for claim in ("exp", "nbf", "iat"):  # PyJWT takes "123" (a string) for a number
            value = payload.get(claim)
            if value is not None and (isinstance(value, bool)
                                      or not isinstance(value, (int, float))):
                raise errors.Unauthenticated(f"token {claim} is not a number")
        exp = payload.get("exp")
        try:
            return Claims(role=role, expires_at=None if exp is None else float(exp))
        except OverflowError:  # an integer past a float's range: 10**400
            raise errors.Unauthenticated("token exp is out of range") from None

    def _decode(self, token: str) -> dict[str, Any]:
        if not _COMPACT.fullmatch(token):
            raise errors.Unauthenticated(MALFORMED)
        header = jwt.get_unverified_header(token)
        alg = header.get("alg")
        if alg != self.algorithm:
            shown = repr(alg) if alg in JWS_ALGORITHMS else "another"  # nothing made up
            raise errors.Unauthenticated(f"token algorithm {shown} not accepted: this key "
                                         f"takes {self.algorithm}")
        if "crit" in header or "b64" in header:
            raise errors.Unauthenticated("token header has crit or b64: not accepted")
        signature = token.rpartition(".")[2]
        if base64url_encode(base64url_decode(signature)).decode() != signature:
            # base64 decoding ignores a last character's unused bits: one signature, several
            # spellings; only the canonical one is a token (one token, one string)
            raise errors.Unauthenticated("malformed token (signature not canonical base64url)")
        payload = jwt.decode(token, self._key, algorithms=[self.algorithm],
                             options={"require": ["sub"],
                                      "verify_aud": self.audience is not None},
                             audience=self.audience, leeway=self.leeway_s)
        if not isinstance(payload, dict):
            raise errors.Unauthenticated("malformed token")
        return payload


def _too_long(n: int) -> str:
    return f"token too long: {n} characters, at most {MAX_TOKEN_CHARS}"


def _reason(exc: Exception) -> str:
    """A fixed reason for PyJWT's refusal: its own messages can quote parts of the token."""
    for cls, text in _REASONS:
        if isinstance(exc, cls):
            return text
    return "token not accepted (a header or claim not understood)"
