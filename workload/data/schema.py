"""The transaction schema of the Fraud Detection Handbook datasets (the GKE tutorial's data).

One place for column names: the simulator writes them, the dataset reader checks them,
feature code reads them. ``TX_FRAUD`` and ``TX_FRAUD_SCENARIO`` are labels, never features.
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
COLUMNS: dict[str, str] = {
    TRANSACTION_ID: "int",
    TX_DATETIME: "datetime",
    CUSTOMER_ID: "int",
    TERMINAL_ID: "int",
    TX_AMOUNT: "float",
    TX_TIME_SECONDS: "int",
    TX_TIME_DAYS: "int",
    TX_FRAUD: "int",
    TX_FRAUD_SCENARIO: "int",
}

LABELS = (TX_FRAUD, TX_FRAUD_SCENARIO)

# File suffixes a dataset may use. Anything else (pickle above all) is refused.
ALLOWED_SUFFIXES = (".parquet", ".csv")
