"""From a store to example arguments and dynamic shapes: groups, values, call forms."""
