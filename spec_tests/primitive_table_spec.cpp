// The case runner's table of primitives (partita/testing/primitive_table.hpp)
// against the Case's list of primitive names: every name a case file may
// give has its entry, every entry is a name a case file may give, and each
// entry carries what the runner, `partita explain` and the benchmarks read.
// One process, no MPI: the table is data.
#include <gtest/gtest.h>

#include <regex>
#include <set>
#include <string>

#include "partita/errors.hpp"
#include "partita/testing/case.hpp"
#include "partita/testing/primitive_table.hpp"

namespace {

using partita::testing::Case;
using partita::testing::ExplainView;
using partita::testing::primitive_entry;
using partita::testing::primitive_table;

// The names Case accepts, as its error for an unknown one lists them
// (`field "primitive": expected one of "broadcast", ..., got "..."`), the
// seeds' alias "transpose" left out (it reads as "repartition").
std::set<std::string> case_names() {
  std::string message;
  try {
    Case::parse(R"({"primitive": "no_such_primitive"})");
  } catch (const partita::CaseError& e) {
    message = e.what();
  }
  const auto from = message.find("expected one of"), to = message.find(", got");
  if (from == std::string::npos || to == std::string::npos) {
    ADD_FAILURE() << "Case's error for an unknown primitive does not list the names: " << message;
    return {};
  }
  const std::string listed = message.substr(from, to - from);
  std::set<std::string> names;
  const std::regex quoted("\"([a-z_]+)\"");
  for (auto it = std::sregex_iterator(listed.begin(), listed.end(), quoted);
       it != std::sregex_iterator(); ++it)
    names.insert((*it)[1]);
  names.erase("transpose");
  return names;
}

TEST(PrimitiveTable, EveryCasePrimitiveHasItsEntryAndNoOther) {
  const auto names = case_names();
  EXPECT_GE(names.size(), 12u) << "the seven primitives and the five Linear layers";
  std::set<std::string> entries;
  for (const auto& e : primitive_table()) {
    EXPECT_TRUE(entries.insert(e.name).second) << "two entries named " << e.name;
    EXPECT_TRUE(names.count(e.name)) << "the table's " << e.name << " is no Case primitive";
  }
  for (const auto& n : names) EXPECT_TRUE(entries.count(n)) << "Case primitive " << n << " has no entry";
  EXPECT_THROW(primitive_entry("no_such_primitive"), partita::Error);
}

TEST(PrimitiveTable, EveryEntryCarriesWhatItsReadersNeed) {
  std::set<std::string> commands;
  for (const auto& e : primitive_table()) {
    SCOPED_TRACE(e.name);
    EXPECT_TRUE(e.reference) << "no reference forward";
    EXPECT_TRUE(e.mpi) << "no MPI layer";
    EXPECT_FALSE(e.twin_fwd.empty()) << "no benchmark twin for " << e.name << "_fwd";
    EXPECT_EQ(e.linear, e.name.rfind("linear", 0) == 0);
    if (!e.linear) {
      EXPECT_FALSE(e.adjoint.empty());
      EXPECT_NO_THROW(primitive_entry(e.adjoint)) << "its adjoint " << e.adjoint << " has no entry";
    }
    if (e.explain != ExplainView::kNone) {
      EXPECT_FALSE(e.explain_command.empty());
      EXPECT_FALSE(e.explain_help.empty());
      EXPECT_TRUE(commands.insert(e.explain_command).second) << "explain " << e.explain_command << " twice";
    }
  }
  // `partita explain`'s primitive subcommands (golden files spec_tests/golden/).
  EXPECT_EQ(commands, (std::set<std::string>{"broadcast", "sum-reduce", "all-sum-reduce", "repartition"}));
}

}  // namespace
