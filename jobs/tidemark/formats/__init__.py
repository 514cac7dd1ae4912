"""Codecs between Kafka records and Tidemark changes (see ``codecs`` for the formats) and
the dead-letter record (``dead_letter``)."""

from tidemark.formats.codecs import Decoder, Encoder, decoder_for, encoder_for, parse_format
from tidemark.formats.errors import DecodeError, FormatError

__all__ = ["DecodeError", "Decoder", "Encoder", "FormatError", "decoder_for", "encoder_for", "parse_format"]
