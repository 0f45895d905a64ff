#include "reference/shared_double_weights.h"

#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace kvdiff::ref {

at::Tensor SharedDoubleCopy(const format::Tensor& t) {
  static std::mutex mutex;
  static std::map<const format::Tensor*, std::weak_ptr<std::vector<double>>> converted;
  std::shared_ptr<std::vector<double>> values;
  {
    std::lock_guard<std::mutex> lock(mutex);
    for (auto it = converted.begin(); it != converted.end();)  // forget what nobody holds
      it = it->second.expired() ? converted.erase(it) : std::next(it);
    std::weak_ptr<std::vector<double>>& slot = converted[&t];
    values = slot.lock();
    if (!values) {
      values = std::make_shared<std::vector<double>>(t.data.begin(), t.data.end());
      slot = values;
    }
  }
  // The tensor keeps the values alive: its deleter drops its share.
  auto* share = new std::shared_ptr<std::vector<double>>(values);
  return at::from_blob(
      values->data(), t.shape, [share](void*) { delete share; },
      at::TensorOptions().dtype(at::kDouble));
}

}  // namespace kvdiff::ref
