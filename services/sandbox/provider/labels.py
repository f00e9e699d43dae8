"""The labels invoices put before their fields, in Turkish, German, English, French and Japanese.

A label counts where a field starts: at the start of a line, or after two or more spaces (the
column gap of a text layout), so "Date" never matches inside "Due Date".
"""

from __future__ import annotations

import re

_START = r"(?:^|(?<=\s\s)|(?<=\t))"
_COLON = r"\s*[:\uff1a]\s*"


def _alternatives(labels: tuple[str, ...]) -> str:
    # longest first, so "Invoice Number" is tried before "Invoice No"
    return "|".join(
        re.escape(label).replace(r"\ ", r"\s+") for label in sorted(labels, key=len, reverse=True)
    )


def labelled(labels: tuple[str, ...], value: str, *, terminator: str = _COLON) -> re.Pattern[str]:
    """``label: value`` anywhere a field may start; group ``v`` is the value."""
    return re.compile(rf"{_START}(?:{_alternatives(labels)}){terminator}(?P<v>{value})", re.IGNORECASE)


def line_label(labels: tuple[str, ...]) -> re.Pattern[str]:
    """A totals line: the label opens the line (after indentation); the amount is read separately."""
    return re.compile(rf"^\s*(?:{_alternatives(labels)})(?![A-Za-z])", re.IGNORECASE)


TAX_ID = labelled(
    (
        "VKN", "TCKN", "Vergi No", "Vergi Numarası", "Vergi Kimlik No",
        "USt-IdNr.", "USt-IdNr", "USt-ID", "USt.-ID", "Steuernummer", "St.-Nr.",
        "VAT Reg No", "VAT Reg. No.", "VAT Registration No", "VAT Registration Number", "VAT No",
        "VAT No.", "VAT Number", "VAT ID", "EIN", "Tax ID", "TIN", "Registration No",
        "N° TVA intracommunautaire", "N° TVA", "TVA intracommunautaire", "Numéro de TVA",
        "登録番号", "法人番号", "適格請求書発行事業者登録番号",
    ),
    r"[A-Za-z0-9][A-Za-z0-9.\-]{2,30}[A-Za-z0-9]",
)  # fmt: skip

INVOICE_NUMBER = labelled(
    (
        "Fatura No", "Fatura Numarası", "Belge No",
        "Rechnungsnummer", "Rechnungs-Nr.", "Rechnung Nr.", "Rechnungsnr.",
        "Invoice Number", "Invoice No.", "Invoice No", "Invoice",
        "N° de facture", "Numéro de facture", "Facture n°", "Facture N°",
        "請求書番号", "請求番号",
    ),
    r"[A-Za-z0-9][A-Za-z0-9\-/._]*",
    terminator=r"\s*(?:[:\uff1a]|\#\s*[:\uff1a]?)\s*",
)  # fmt: skip

ISSUE_DATE = labelled(
    (
        "Fatura Tarihi", "Düzenleme Tarihi", "Rechnungsdatum", "Datum", "Invoice Date", "Issue Date",
        "Date of issue", "Date", "Date de facture", "Date d'émission", "Date de facturation",
        "請求日", "発行日",
    ),
    r".+",
)  # fmt: skip

DUE_DATE = labelled(
    (
        "Son Ödeme Tarihi", "Vade Tarihi", "Fälligkeitsdatum", "Fällig am", "Zahlbar bis", "Due Date",
        "Payment Due", "Due", "Date d'échéance", "Échéance", "Echéance", "支払期限", "お支払期限",
    ),
    r".+",
)  # fmt: skip

CURRENCY = labelled(("Para Birimi", "Döviz", "Währung", "Currency", "Devise", "通貨"), r"[A-Z]{3}\b")

SUBTOTAL = line_label(
    (
        "Ara Toplam", "Mal Hizmet Toplam Tutarı", "Nettobetrag", "Zwischensumme", "Summe netto",
        "Subtotal", "Sub-total", "Sub total", "Net total", "Net amount", "Total HT", "Montant HT",
        "Sous-total", "小計", "税抜合計",
    )
)  # fmt: skip

TAX = line_label(
    (
        "KDV", "MwSt.", "MwSt", "USt.", "USt", "Umsatzsteuer", "Sales tax", "VAT", "Tax",
        "Consumption tax", "TVA", "消費税",
    )
)  # fmt: skip

TOTAL = line_label(
    (
        "Genel Toplam", "Ödenecek Tutar", "Toplam", "Rechnungsbetrag", "Gesamtbetrag", "Bruttobetrag",
        "Total due", "Amount due", "Balance due", "Grand total", "Total", "Total TTC", "Net à payer",
        "Montant TTC", "合計", "ご請求金額", "請求金額", "税込合計",
    )
)  # fmt: skip

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
