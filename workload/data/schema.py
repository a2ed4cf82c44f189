"""The transaction schema of the Fraud Detection Handbook datasets (the GKE tutorial's data).

One place for column names: the simulator writes them, the dataset reader checks them,
feature code reads them. ``TX_FRAUD`` and ``TX_FRAUD_SCENARIO`` are labels, never features.

A bank's export has an ID, a time, a card, a terminal, an amount and (on labelled days) the label:
``REQUIRED``. The simulator's ``TX_TIME_SECONDS``, ``TX_TIME_DAYS`` and ``TX_FRAUD_SCENARIO`` are
``OPTIONAL``: no feature reads them, so they are accepted and dropped, never required.
"""

TRANSACTION_ID = "TRANSACTION_ID"
TX_DATETIME = "TX_DATETIME"
CUSTOMER_ID = "CUSTOMER_ID"
TERMINAL_ID = "TERMINAL_ID"
TX_AMOUNT = "TX_AMOUNT"
TX_TIME_SECONDS = "TX_TIME_SECONDS"
TX_TIME_DAYS = "TX_TIME_DAYS"
TX_FRAUD = "TX_FRAUD"
TX_FRAUD_SCENARIO = "TX_FRAUD_SCENARIO"

# Column -> kind of values allowed ("int": integer, "float": real number, "datetime": timestamp).
# What a validated frame holds, in this order; TX_FRAUD is absent or empty on unlabelled (scoring) days.
COLUMNS: dict[str, str] = {
    TRANSACTION_ID: "int",
    TX_DATETIME: "datetime",
    CUSTOMER_ID: "int",
    TERMINAL_ID: "int",
    TX_AMOUNT: "float",
    TX_FRAUD: "int",
}
OPTIONAL = (TX_TIME_SECONDS, TX_TIME_DAYS, TX_FRAUD_SCENARIO)  # the simulator's: read past, never used
KNOWN = (*COLUMNS, *OPTIONAL)  # every name a column mapping may target
# What the simulator writes (the tutorial's files), in the tutorial's column order.
SIMULATED: dict[str, str] = {name: COLUMNS.get(name, "int") for name in (
    TRANSACTION_ID, TX_DATETIME, CUSTOMER_ID, TERMINAL_ID, TX_AMOUNT, TX_TIME_SECONDS, TX_TIME_DAYS, TX_FRAUD,
    TX_FRAUD_SCENARIO)}

LABELS = (TX_FRAUD, TX_FRAUD_SCENARIO)

# The bank's IDs may be text (references, tokens, hashes) or numbers. Each is keyed as an int64 (a number
# as itself, text by a stable hash: workload.data.dayfile.id_keys); where a file's IDs are text, the validated
# frame also carries them as given, in these columns, so every output gives them back unchanged.
IDS = (TRANSACTION_ID, CUSTOMER_ID, TERMINAL_ID)
AS_GIVEN = {column: f"{column}_AS_GIVEN" for column in IDS}

# File suffixes a dataset may use. Anything else (pickle above all) is refused.
ALLOWED_SUFFIXES = (".parquet", ".csv")
