"""Tokens (source/security/tokens.py): made and validated for each algorithm, and every way a
token can be wrong refused as `Unauthenticated` (never another exception), with a reason that
never quotes the token: expired, wrong key, wrong or `none` algorithm, an HS256 token signed
with the RS256 public key (algorithm confusion), truncated, huge, garbage, no or an empty
`sub`; then a fuzz of random text and mutated tokens. Unit tests: no process starts."""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import time

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shadowtopic.core import errors
from shadowtopic.security import tokens
from shadowtopic.security.tokens import Claims, TokenValidator, create_token

ALGS = ("HS256", "RS256", "ES256")


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def hand_made(header: dict, payload: dict, signature: bytes = b"") -> str:
    """A token put together without PyJWT (which refuses to make the bad ones)."""
    return ".".join([b64url(json.dumps(header).encode()), b64url(json.dumps(payload).encode()),
                     b64url(signature)])


class Keys:
    """A signing key and the validator's key material of one algorithm."""

    def __init__(self, algorithm: str):
        self.algorithm = algorithm
        if algorithm == "HS256":
            self.signing = self.verifying = tokens.create_secret_key()
            self.loaded = self.signing
        else:
            self.signing, self.verifying = tokens.create_key_pair(algorithm)
            # loaded once: loading an RSA private key checks it, tens of ms
            self.loaded = serialization.load_pem_private_key(self.signing, password=None)
        self._validator = TokenValidator(self.verifying, algorithm)

    def token(self, subject: str = "alice", expiry_s: float | None = 3600, **kw) -> str:
        return create_token(subject, self.signing, self.algorithm, expiry_s, **kw)

    def validator(self) -> TokenValidator:
        return self._validator

    def raw(self, payload: dict, headers: dict | None = None) -> str:
        """A token PyJWT signs with this key: any payload, any extra header."""
        return jwt.encode(payload, self.loaded, algorithm=self.algorithm, headers=headers)


@pytest.fixture(scope="module")
def keys() -> dict[str, Keys]:
    return {alg: Keys(alg) for alg in ALGS}


@pytest.fixture(scope="module")
def other_keys() -> dict[str, Keys]:
    return {alg: Keys(alg) for alg in ALGS}


def refused(validator: TokenValidator, token, reason: str = "") -> str:
    """The validator refuses `token` with Unauthenticated naming `reason`; the message."""
    with pytest.raises(errors.Unauthenticated) as info:
        validator.validate(token)
    msg = info.value.message
    assert reason in msg, (reason, msg)
    if isinstance(token, str) and len(token) >= 12:
        assert token not in msg
        for part in token.split("."):
            assert len(part) < 12 or part not in msg, msg
    # no chained exception (PyJWT's own message can quote the token) shows in a traceback
    assert info.value.__cause__ is None
    assert info.value.__context__ is None or info.value.__suppress_context__
    return msg


# ---- made and validated ------------------------------------------------------------------------

@pytest.mark.parametrize("alg", ALGS)
def test_a_token_validates_with_its_key_for_each_algorithm(keys, alg):
    k = keys[alg]
    before = int(time.time())
    claims = k.validator().validate(k.token("team-a", expiry_s=3600))
    assert claims.role == "team-a"
    assert before + 3600 <= claims.expires_at <= time.time() + 3601
    assert k.validator().validate(k.token("svc", expiry_s=None)) == Claims("svc", None)
    # bytes are taken too (as gRPC metadata may hand them)
    assert k.validator().validate(k.token("b").encode()).role == "b"


@pytest.mark.parametrize("alg", ALGS)
def test_claims_are_sub_and_with_an_expiry_exp_and_iat(keys, alg):
    k = keys[alg]
    token = k.token("r", expiry_s=90.2, now=1_000_000.7, headers={"kid": "2024"})
    header = jwt.get_unverified_header(token)
    assert header["alg"] == alg and header["kid"] == "2024"
    claims = jwt.decode(token, options={"verify_signature": False})
    assert claims == {"sub": "r", "iat": 1_000_000, "exp": 1_000_091}
    assert jwt.decode(k.token("r", expiry_s=None), options={"verify_signature": False}) == \
        {"sub": "r"}


def test_a_token_without_expiry_is_the_same_each_time(keys):
    k = keys["HS256"]
    assert k.token("svc", expiry_s=None) == k.token("svc", expiry_s=None)


def test_key_pairs_are_rsa_2048_and_p256():
    private, public = tokens.create_key_pair("RS256")
    key = serialization.load_pem_private_key(private, password=None)
    assert isinstance(key, rsa.RSAPrivateKey) and key.key_size == 2048
    assert public.startswith(b"-----BEGIN PUBLIC KEY-----")
    private, public = tokens.create_key_pair("ES256")
    key = serialization.load_pem_private_key(private, password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name == "secp256r1"
    assert tokens.key_algorithm(public) == "ES256"
    with pytest.raises(errors.InvalidArgument):
        tokens.create_key_pair("HS256")
    assert len(tokens.create_secret_key()) == 32
    assert tokens.create_secret_key() != tokens.create_secret_key()


# ---- refused ------------------------------------------------------------------------------------

@pytest.mark.parametrize("alg", ALGS)
def test_expired_past_the_leeway_is_refused_within_it_accepted(keys, alg):
    k = keys[alg]
    now = time.time()
    refused(k.validator(), k.token(expiry_s=60, now=now - 70), "expired")
    refused(k.validator(), k.raw({"sub": "a", "exp": int(now) - 3600}), "expired")
    assert k.validator().validate(k.token(expiry_s=60, now=now - 62)).role == "alice"


@pytest.mark.parametrize("alg", ALGS)
def test_not_yet_valid_is_refused(keys, alg):
    k = keys[alg]
    now = int(time.time())
    refused(k.validator(), k.raw({"sub": "a", "nbf": now + 60}), "not valid yet")
    refused(k.validator(), k.raw({"sub": "a", "iat": now + 60}), "not valid yet")
    assert k.validator().validate(k.raw({"sub": "a", "nbf": now + 2})).role == "a"


@pytest.mark.parametrize("alg", ALGS)
def test_a_token_of_another_key_is_refused(keys, other_keys, alg):
    refused(keys[alg].validator(), other_keys[alg].token(), "signature does not verify")


@pytest.mark.parametrize("alg", ALGS)
@pytest.mark.parametrize("signed_with", ALGS)
def test_a_token_of_another_algorithm_is_refused(keys, alg, signed_with):
    if alg == signed_with:
        return
    refused(keys[alg].validator(), keys[signed_with].token(), "not accepted")


@pytest.mark.parametrize("alg", ALGS)
def test_alg_none_is_refused_however_spelled(keys, alg):
    v = keys[alg].validator()
    refused(v, jwt.encode({"sub": "root"}, None, algorithm="none"), "'none' not accepted")
    for spelled in ("none", "None", "NONE", "nOnE"):
        token = hand_made({"alg": spelled, "typ": "JWT"}, {"sub": "root"})
        refused(v, token, "not accepted")
        refused(v, token + "AAAA", "not accepted")  # with a signature after all
    refused(v, hand_made({"typ": "JWT"}, {"sub": "root"}, b"x" * 32), "not accepted")


@pytest.mark.parametrize("alg", ["RS256", "ES256"])
def test_hs256_signed_with_the_public_key_is_refused_alg_confusion(keys, alg):
    """The classic attack: the public key is public, so an HMAC over it with the public key
    PEM as the secret would pass a validator that let the token pick the algorithm."""
    public_pem = keys[alg].verifying
    header = b64url(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    payload = b64url(json.dumps({"sub": "root"}).encode())
    mac = hmac.new(public_pem, f"{header}.{payload}".encode(), hashlib.sha256).digest()
    token = f"{header}.{payload}.{b64url(mac)}"
    refused(keys[alg].validator(), token, "'HS256' not accepted: this key takes " + alg)
    # and an HS256 validator never takes a PEM as its secret
    with pytest.raises(errors.InvalidArgument, match="PEM"):
        TokenValidator(public_pem, "HS256")
    with pytest.raises(errors.InvalidArgument, match="PEM"):
        create_token("root", public_pem, "HS256", None)


@pytest.mark.parametrize("alg", ALGS)
def test_truncated_tokens_are_refused(keys, alg):
    k = keys[alg]
    token = k.token()
    v = k.validator()
    head, payload, sig = token.split(".")
    for cut in (token[:-1], token[:-4], token[: len(token) // 2], f"{head}.{payload}",
                f"{head}.{payload}.", head, f"{head}.", token[1:], f".{payload}.{sig}"):
        refused(v, cut)


@pytest.mark.parametrize("alg", ALGS)
def test_huge_tokens_are_refused_before_parsing(keys, alg, monkeypatch):
    k = keys[alg]
    v = k.validator()
    parsed = []
    monkeypatch.setattr(jwt, "get_unverified_header", lambda t: parsed.append(t))
    refused(v, "a" * (tokens.MAX_TOKEN_CHARS + 1), "too long")
    refused(v, b"a" * 10_000_000, "too long")
    assert parsed == []
    monkeypatch.undo()
    # signed and valid but for its size
    signed = k.raw({"sub": "a", "pad": "x" * tokens.MAX_TOKEN_CHARS})
    refused(v, signed, "too long")


@pytest.mark.parametrize("garbage", [
    "", " ", "\n", "not a token", "a.b.c", "..", "a..c", ".b.", "a.b.c.d", "a.b.c.d.e",
    "Bearer abc.def.ghi", "eyJ.eyJ.eyJ", "é.é.é", "\x00.\x00.\x00", "a\nb.c.d",
    b"\xff\xfe.\x00.x", 12345, None, ["a.b.c"],
])
def test_garbage_is_refused(keys, garbage):
    for k in keys.values():
        refused(k.validator(), garbage)


@pytest.mark.parametrize("alg", ALGS)
def test_header_and_payload_that_are_not_json_objects_are_refused(keys, alg):
    k = keys[alg]
    v = k.validator()
    sig = b64url(os.urandom(32))
    good = b64url(json.dumps({"alg": alg}).encode())
    for head in (b"[]", b"1", b"null", b"{", b"\xff\xfe", b"[" * 50_00 + b"]" * 50_00):
        refused(v, f"{b64url(head)}.{b64url(b'{}')}.{sig}")
    for body in (b"[]", b"1", b"null", b"{", b"\xff\xfe", b"[" * 5000 + b"]" * 5000,
                 b'{"sub": "a", "exp": 1e400}', b'{"sub": "a", "exp": NaN}'):
        refused(v, f"{good}.{b64url(body)}.{sig}")


@pytest.mark.parametrize("alg", ALGS)
def test_odd_claims_signed_with_the_right_key_are_refused(keys, alg):
    """Tokens only a key holder can make, so no attack; a bad issuer, still refused."""
    k = keys[alg]
    v = k.validator()
    refused(v, k.raw({"exp": int(time.time()) + 60}), "no sub")
    refused(v, k.raw({"sub": None}), "no sub")
    refused(v, k.raw({"sub": ""}), "empty")
    refused(v, k.raw({"sub": "   "}), "empty")
    for sub in (123, ["a"], {"a": 1}, True):
        refused(v, k.raw({"sub": sub}), "not a string")
    refused(v, k.raw({"sub": "a\nforged log line"}), "control character")
    refused(v, k.raw({"sub": "x" * (tokens.MAX_ROLE_CHARS + 1)}), "longer than")
    assert v.validate(k.raw({"sub": "x" * tokens.MAX_ROLE_CHARS})).role
    refused(v, k.raw({"sub": "a", "exp": "99999999999"}), "exp is not a number")
    refused(v, k.raw({"sub": "a", "exp": "soon"}))
    refused(v, k.raw({"sub": "a", "exp": 1e400}))
    refused(v, k.raw({"sub": "a", "iat": "then"}))
    refused(v, k.raw({"sub": "a", "iat": "1000"}), "iat is not a number")
    refused(v, k.raw({"sub": "a", "nbf": "1000"}), "nbf is not a number")
    refused(v, k.raw({"sub": "a", "exp": True}))
    refused(v, k.raw({"sub": "a", "exp": 10**400}), "out of range")
    refused(v, k.raw({"sub": "a", "exp": -10**400}), "expired")
    refused(v, k.raw({"sub": "a", "nbf": 10**400}), "not valid yet")
    refused(v, hand_made({"alg": "made-up\nline"}, {"sub": "a"}, b"x"), "algorithm another")
    refused(v, k.raw({"sub": "a"}, headers={"crit": ["exp"]}), "not")
    assert v.validate(k.raw({"sub": "a", "exp": 2**40, "extra": [1, 2]})) == \
        Claims("a", float(2**40))


def test_audience_checked_only_when_configured(keys):
    k = keys["ES256"]
    plain = k.validator()
    with_aud = TokenValidator(k.verifying, "ES256", audience="shadowtopic")
    assert plain.validate(k.raw({"sub": "a", "aud": "other"})).role == "a"
    assert with_aud.validate(k.raw({"sub": "a", "aud": ["x", "shadowtopic"]})).role == "a"
    refused(with_aud, k.raw({"sub": "a", "aud": "other"}), "audience")
    refused(with_aud, k.raw({"sub": "a"}))


def test_a_signature_spelled_non_canonically_is_refused(keys):
    """base64 decoding ignores a last character's unused bits: a token whose signature is
    spelled differently decodes to the same signature, yet is not the token that was made
    (one token, one string). Padding and whitespace are refused too."""
    k = keys["HS256"]
    token = k.token()
    v = k.validator()
    assert len(token.rpartition(".")[2]) % 4 == 3  # 32 bytes: 43 chars, the last has 2 unused bits
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    last = alphabet.index(token[-1])
    twin = token[:-1] + alphabet[last ^ 1]   # same 4 data bits
    assert base64.urlsafe_b64decode(twin.rpartition(".")[2] + "=") == \
        base64.urlsafe_b64decode(token.rpartition(".")[2] + "=")
    refused(v, twin)  # PyJWT >= 2.1x refuses it itself; tokens.py does for older ones
    refused(v, token + "\n")
    refused(v, token + "=")
    refused(v, " " + token)


# ---- keys and key files --------------------------------------------------------------------------

def test_bad_key_material_is_invalid_argument_when_the_validator_is_made(keys):
    rs, es = keys["RS256"], keys["ES256"]
    cases = [
        (b"short", "HS256", "at least 32"),
        (rs.verifying, "ES256", "P-256 EC public key"),
        (es.verifying, "RS256", "RSA public key"),
        (rs.signing, "RS256", "public key"),          # the private key on a validator
        (b"not a pem", "RS256", "not a PEM"),
        (tokens.create_secret_key(), "HS512", "not one of"),
        (tokens.create_secret_key(), "none", "not one of"),
    ]
    small = rsa.generate_private_key(public_exponent=65537, key_size=1024).public_key()
    cases.append((small.public_bytes(serialization.Encoding.PEM,
                                     serialization.PublicFormat.SubjectPublicKeyInfo),
                  "RS256", "1024 bits"))
    p384 = ec.generate_private_key(ec.SECP384R1()).public_key()
    cases.append((p384.public_bytes(serialization.Encoding.PEM,
                                    serialization.PublicFormat.SubjectPublicKeyInfo),
                  "ES256", "P-256"))
    for material, alg, reason in cases:
        with pytest.raises(errors.InvalidArgument, match=reason):
            TokenValidator(material, alg)


def test_create_token_refuses_bad_subjects_keys_expiries_and_headers(keys):
    k = keys["HS256"]
    for subject in ("", "  ", "a\tb", "x" * 300):
        with pytest.raises(errors.InvalidArgument):
            create_token(subject, k.signing, "HS256", None)
    for expiry in (0, -1, float("inf"), float("nan"), True):
        with pytest.raises(errors.InvalidArgument, match="expiry"):
            create_token("a", k.signing, "HS256", expiry)
    for header in ("alg", "b64", "crit"):
        with pytest.raises(errors.InvalidArgument, match=header):
            create_token("a", k.signing, "HS256", None, headers={header: "none"})
    with pytest.raises(errors.InvalidArgument, match="RSA private key"):
        create_token("a", keys["ES256"].signing, "RS256", None)
    with pytest.raises(errors.InvalidArgument, match="RSA private key"):
        create_token("a", keys["RS256"].verifying, "RS256", None)


def test_secret_key_files_raw_or_base64(tmp_path):
    key = tokens.create_secret_key()
    raw, b64 = tmp_path / "raw.key", tmp_path / "b64.key"
    raw.write_bytes(key)
    b64.write_bytes(base64.b64encode(key) + b"\n")
    assert tokens.load_secret_key(str(raw)) == key
    assert tokens.load_secret_key(str(b64)) == key
    token = create_token("a", tokens.load_secret_key(str(raw)), "HS256", 60)
    assert TokenValidator.from_files(secret_key=str(b64)).validate(token).role == "a"
    # a raw key that is not base64 text is the key as it is, whitespace and all
    text = tmp_path / "text.key"
    text.write_bytes(b"correct horse battery staple, and a few more words\n")
    assert tokens.load_secret_key(str(text)) == text.read_bytes()


def test_key_file_problems_are_one_clear_error(tmp_path):
    (tmp_path / "empty").write_bytes(b"")
    (tmp_path / "short").write_bytes(base64.b64encode(b"x" * 16))
    (tmp_path / "huge").write_bytes(b"x" * (tokens.MAX_KEY_FILE_BYTES + 1))
    for name, reason in [("missing", "No such file"), ("empty", "empty"),
                         ("short", "16 bytes"), ("huge", "larger than"), (".", "directory")]:
        with pytest.raises(errors.InvalidArgument, match=reason) as info:
            tokens.load_secret_key(str(tmp_path / name))
        assert str(tmp_path) in info.value.message


def test_key_pair_files_name_their_algorithm(tmp_path, keys):
    for alg in ("RS256", "ES256"):
        path = tmp_path / f"{alg}.pem"
        path.write_bytes(keys[alg].verifying)
        assert tokens.load_key_pair_file(str(path)) == (keys[alg].verifying, alg)
        other = "ES256" if alg == "RS256" else "RS256"
        with pytest.raises(errors.InvalidArgument, match=f"not {other}"):
            tokens.load_key_pair_file(str(path), other)
        v = TokenValidator.from_files(public_key=str(path))
        assert v.algorithm == alg and v.validate(keys[alg].token()).role == "alice"
    with pytest.raises(errors.InvalidArgument, match="secret key is for HS256"):
        TokenValidator.from_files(secret_key=str(path), algorithm="RS256")
    with pytest.raises(errors.InvalidArgument):
        TokenValidator.from_files()


# ---- fuzz ---------------------------------------------------------------------------------------

FUZZ = settings(max_examples=200, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=12)


@FUZZ
@given(text=st.text(max_size=300) | st.binary(max_size=300).map(lambda b: b.decode("latin-1")))
def test_fuzz_random_text_is_always_unauthenticated(keys, text):
    for k in keys.values():
        refused(k.validator(), text)


@pytest.fixture(scope="module")
def made(keys) -> list[tuple[Keys, str]]:
    """Tokens to mutate: each algorithm, with and without an expiry."""
    return [(k, k.token(role, expiry)) for k in keys.values()
            for role, expiry in [("alice", 3600), ("x" * 40, None)]]


@FUZZ
@given(data=st.data())
def test_fuzz_mutated_tokens_are_always_unauthenticated(made, data):
    k, original = data.draw(st.sampled_from(made))
    token = original
    for _ in range(data.draw(st.integers(1, 3))):
        op = data.draw(st.sampled_from(["replace", "delete", "insert", "truncate", "swap",
                                        "segment"]))
        i = data.draw(st.integers(0, max(0, len(token) - 1)))
        char = data.draw(st.characters(codec="ascii") | st.sampled_from("._-AaZz09="))
        parts = token.split(".")
        if op == "replace":
            token = token[:i] + char + token[i + 1:]
        elif op == "delete":
            token = token[:i] + token[i + 1:]
        elif op == "insert":
            token = token[:i] + char + token[i:]
        elif op == "truncate":
            token = token[:i]
        elif op == "swap" and len(parts) == 3:
            a, b = data.draw(st.permutations([0, 1, 2]))[:2]
            parts[a], parts[b] = parts[b], parts[a]
            token = ".".join(parts)
        elif op == "segment" and len(parts) == 3:
            which = data.draw(st.integers(0, 2))
            parts[which] = b64url(json.dumps(data.draw(JSON)).encode()) if which < 2 else \
                b64url(data.draw(st.binary(max_size=300)))
            token = ".".join(parts)
    if token != original:
        refused(k.validator(), token)


@FUZZ
@given(header=st.dictionaries(st.sampled_from(["alg", "typ", "kid", "crit", "b64", "jwk"]),
                              JSON | st.sampled_from(ALGS + ("none", "HS512", "PS256"))),
       payload=st.dictionaries(st.sampled_from(["sub", "exp", "iat", "nbf", "aud"]), JSON),
       signature=st.binary(max_size=300))
def test_fuzz_forged_tokens_are_always_unauthenticated(keys, header, payload, signature):
    token = hand_made(header, payload, signature)
    for k in keys.values():
        refused(k.validator(), token)
