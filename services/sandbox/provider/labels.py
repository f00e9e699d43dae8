"""The labels invoices put before their fields, in Turkish, German, English, French, Spanish,
Dutch, Italian and Japanese (the totals are classed by their words instead: see ``totals``).

A label counts where a field starts: at the start of a line, after two or more spaces (the column
gap of a text layout), or after a ``/`` or ``|`` that separates fields ("FATURA / INVOICE No:"),
so "Date" never matches inside "Due Date". A label is a whole word: "Date" is not "Dated". A tax
id's label is distinctive enough to count after any word ("Seyhan V.D. VKN: 2210334455").
"""

from __future__ import annotations

import re

_START = r"(?:^|(?<=\s\s)|(?<=\t)|(?<=[/|]\s)|(?<=\|))"
_WORD_START = r"(?<![^\W_])"
_END = r"(?![^\W\d_])"
_COLON = r"\s*[:\uff1a]\s*"
_COLON_OR_SPACE = r"(?:\s*[:\uff1a]\s*|\s+)"


def _alternatives(labels: tuple[str, ...]) -> str:
    # longest first, so "Invoice Number" is tried before "Invoice No"
    return "|".join(
        re.escape(label).replace(r"\ ", r"\s+") for label in sorted(labels, key=len, reverse=True)
    )


def labelled(
    labels: tuple[str, ...], value: str, *, terminator: str = _COLON, start: str = _START
) -> re.Pattern[str]:
    """``label: value`` anywhere a field may start; group ``v`` is the value."""
    return re.compile(rf"{start}(?:{_alternatives(labels)}){_END}{terminator}(?P<v>{value})", re.IGNORECASE)


TAX_ID = labelled(
    (
        "VKN", "TCKN", "VKN/TCKN", "Vergi No", "Vergi No.", "Vergi Numarası", "Vergi Kimlik No",
        "Vergi Kimlik Numarası",
        "USt-IdNr.", "USt-IdNr", "USt-ID", "USt.-ID", "USt-ID-Nr.", "Steuernummer", "St.-Nr.",
        "UID", "UID-Nr.", "UID Nr.", "MWST-Nr.", "MWST Nr.", "MwSt-Nr.",
        "VAT Reg No", "VAT Reg No.", "VAT Reg. No.", "VAT Registration No", "VAT Registration No.",
        "VAT Registration Number", "VAT No", "VAT No.", "VAT Number", "VAT ID", "EIN", "Tax ID", "TIN",
        "Registration No",
        "N° TVA intracommunautaire", "N° TVA", "TVA intracommunautaire", "TVA intracom.", "Numéro de TVA",
        "N° de TVA",
        "NIF", "CIF", "N.I.F.", "C.I.F.", "NIF/CIF",
        "BTW-nummer", "BTW nummer", "BTW-nr", "BTW-nr.", "BTW nr.", "Btw-id", "Btw-identificatienummer",
        "P.IVA", "P. IVA", "Partita IVA", "C.F.", "Codice fiscale",
        "登録番号", "法人番号", "適格請求書発行事業者登録番号",
    ),
    # letters, digits, dots and dashes; a single space goes on only into a group holding a digit
    # ("GB 284 5512 07", "FR 58 812345678"), never into the next word ("CHE-123.456.788 MWST")
    r"(?=[A-Za-z0-9.\- ]*\d)[A-Za-z0-9][A-Za-z0-9.\-]*(?: [A-Z]{0,2}\d[A-Za-z0-9.\-]*)*[A-Za-z0-9]",
    terminator=_COLON_OR_SPACE,
    start=_WORD_START,
)  # fmt: skip

# An invoice number holds a digit and ends with a letter or digit.
_NUMBER_VALUE = r"(?=[A-Za-z0-9\-/._]*\d)[A-Za-z0-9](?:[A-Za-z0-9\-/._]*[A-Za-z0-9])?"
# Labels that say "number" themselves: the value may follow them after a colon, a # or spaces.
_NUMBER_LABELS = (
    "Fatura No", "Fatura No.", "Fatura Numarası", "Belge No",
    "Rechnungsnummer", "Rechnungs-Nr.", "Rechnung Nr.", "Rechnungsnr.",
    "Invoice Number", "Invoice No.", "Invoice No", "Invoice Nr.", "Invoice #",
    "N° de facture", "Numéro de facture", "Facture n°", "Facture N°", "Facture nº",
    "Nº Factura", "N° Factura", "Factura Nº", "Factura N°", "Factura nº", "Factura núm.", "Factura número",
    "Número de factura", "Núm. factura",
    "Factuurnummer", "Factuurnr.", "Factuurnr", "Factuur nr.", "Factuur nr",
    "Fattura n.", "Fattura n°", "Fattura nº", "Fattura nr.", "Numero fattura", "Fattura numero",
    "請求書番号", "請求番号",
)  # fmt: skip
# A document's title: the value follows only a colon or a # ("Invoice: 7", "INVOICE # 10472").
_TITLE_LABELS = ("Invoice", "Fatura", "Rechnung", "Facture", "Factura", "Factuur", "Fattura")

INVOICE_NUMBER = re.compile(
    rf"{_START}(?:(?:{_alternatives(_NUMBER_LABELS)}){_END}\s*(?:[:\uff1a#]\s*)?"
    rf"|(?:{_alternatives(_TITLE_LABELS)}){_END}\s*(?:[:\uff1a]|\#\s*[:\uff1a]?)\s*)"
    rf"(?P<v>{_NUMBER_VALUE})",
    re.IGNORECASE,
)

# Dates: the label may stand without a colon; the date must open the value (see ``extract``).
ISSUE_DATE = labelled(
    (
        "Tarih", "Fatura Tarihi", "Düzenleme Tarihi", "Düzenlenme Tarihi", "Belge Tarihi",
        "Rechnungsdatum", "Datum", "Invoice Date", "Issue Date", "Date of issue", "Date", "Dated",
        "Date de facture", "Date d'émission", "Date de facturation",
        "Fecha", "Fecha de emisión", "Fecha de factura", "Fecha factura",
        "Factuurdatum", "Data", "Data fattura", "Data documento", "Data emissione",
        "請求日", "発行日",
    ),
    r".+",
    terminator=_COLON_OR_SPACE,
)  # fmt: skip

DUE_DATE = labelled(
    (
        "Son Ödeme Tarihi", "Vade", "Vade Tarihi", "Fälligkeitsdatum", "Fällig am", "Zahlbar bis",
        "Due Date", "Payment Due", "Due", "Due by",
        "Date d'échéance", "Échéance", "Echéance",
        "Vencimiento", "Fecha de vencimiento", "Fecha vencimiento",
        "Vervaldatum", "Uiterste betaaldatum",
        "Scadenza", "Data scadenza", "Data di scadenza",
        "支払期限", "お支払期限",
    ),
    r".+",
    terminator=_COLON_OR_SPACE,
)  # fmt: skip

CURRENCY = labelled(
    ("Para Birimi", "Döviz", "Währung", "Currency", "Devise", "Moneda", "Divisa", "Valuta", "通貨"),
    r"[A-Z]{3}\b",
)

# A paragraph speaking to the model rather than to the buyer (a prompt injection).
INJECTION = re.compile(
    r"ignore (all |any )?(previous|prior|above) instructions|note to (the )?(ai|model|assistant|llm)"
    r"|you are an? (ai|language model)|system prompt|önceki talimatları"
    r"|ignorier\w* (sie )?(alle )?(vorherigen|bisherigen) anweisungen|hinweis an die ki",
    re.IGNORECASE,
)

# Words a document puts on a line of its own as its title, never the supplier's name.
TITLES = frozenset(
    {"fatura", "invoice", "tax invoice", "rechnung", "facture", "請求書", "e-fatura", "e-arşiv fatura"}
)

CURRENCY_CODES = ("TRY", "EUR", "USD", "GBP", "JPY", "CHF", "SEK", "NOK", "DKK", "PLN", "CZK", "CAD", "AUD")
CURRENCY_SYMBOLS = (("€", "EUR"), ("£", "GBP"), ("₺", "TRY"), ("¥", "JPY"), ("円", "JPY"), ("$", "USD"))
# Currencies written as a word: the Turkish lira's "TL" beside amounts, "in euro" in a sentence.
CURRENCY_WORDS = re.compile(r"(?<![^\W\d_])(?:(?P<TRY>TL)|(?P<EUR>[Ee]uros?))(?![^\W\d_])")
